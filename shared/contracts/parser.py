"""AVAP parser diagnostics shared by the parser service and its clients.

The parser service (`services.parser`) and the validator (`services.validator`) both speak
in these structs; neither imports the other's modules.
"""

from __future__ import annotations

import msgspec


class TraceLine(msgspec.Struct, frozen=True):
    """One diagnostic. `line`/`column` are 1-based; `code` is a stable identifier."""

    line: int
    column: int
    code: str
    message: str
    suggestion: str = ""


# Diagnostics that are reported but do not make a program invalid (see services.parser.avap).
WARNING_CODES: frozenset[str] = frozenset({"TOLERATED_UNKNOWN_COMMAND"})


def is_error(trace_line: TraceLine) -> bool:
    return trace_line.code not in WARNING_CODES
