"""AVAP parser diagnostics shared by the parser service and its clients.

The parser service (`services.parser`) and the validator (`services.validator`) both speak
in these structs; neither imports the other's modules.
"""

from __future__ import annotations

import enum

import msgspec


class TraceCode(enum.StrEnum):
    """Stable identifiers of parser diagnostics (`TraceLine.code`)."""

    UNKNOWN_COMMAND = "UNKNOWN_COMMAND"
    ARG_COUNT = "ARG_COUNT"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    UNCLOSED_BLOCK = "UNCLOSED_BLOCK"
    UNEXPECTED_BLOCK_END = "UNEXPECTED_BLOCK_END"
    UNBALANCED_BRACKETS = "UNBALANCED_BRACKETS"
    UNTERMINATED_STRING = "UNTERMINATED_STRING"
    FOREIGN_SYNTAX = "FOREIGN_SYNTAX"
    INVALID_ASSIGNMENT = "INVALID_ASSIGNMENT"
    SYNTAX_ERROR = "SYNTAX_ERROR"
    TOLERATED_UNKNOWN_COMMAND = "TOLERATED_UNKNOWN_COMMAND"


class TraceLine(msgspec.Struct, frozen=True):
    """One diagnostic. `line`/`column` are 1-based; `code` is a stable identifier."""

    line: int
    column: int
    code: str
    message: str
    suggestion: str = ""


# Diagnostics that are reported but do not make a program invalid (see services.parser.avap).
WARNING_CODES: frozenset[str] = frozenset({TraceCode.TOLERATED_UNKNOWN_COMMAND})


def is_error(trace_line: TraceLine) -> bool:
    return trace_line.code not in WARNING_CODES
