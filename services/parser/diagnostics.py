"""What the AVAP parser reports: the trace codes it uses, its result, the `Reporter` that
collects trace lines, and the AVAP command a misspelt or hallucinated name stands for.

Every diagnostic names the construct, the reason and (where one exists) the AVAP
replacement, since the trace is meant for an LLM retry.
"""

from __future__ import annotations

import difflib

import msgspec

from services.parser.commands import ALIASES, COMMANDS
from shared.contracts.parser import TraceCode, TraceLine

# The trace codes this parser reports (shared.contracts.parser.TraceCode).
UNKNOWN_COMMAND = TraceCode.UNKNOWN_COMMAND
ARG_COUNT = TraceCode.ARG_COUNT
INVALID_ARGUMENT = TraceCode.INVALID_ARGUMENT
UNCLOSED_BLOCK = TraceCode.UNCLOSED_BLOCK
UNEXPECTED_BLOCK_END = TraceCode.UNEXPECTED_BLOCK_END
UNBALANCED_BRACKETS = TraceCode.UNBALANCED_BRACKETS
UNTERMINATED_STRING = TraceCode.UNTERMINATED_STRING
FOREIGN_SYNTAX = TraceCode.FOREIGN_SYNTAX
INVALID_ASSIGNMENT = TraceCode.INVALID_ASSIGNMENT
SYNTAX_ERROR = TraceCode.SYNTAX_ERROR
TOLERATED_UNKNOWN_COMMAND = TraceCode.TOLERATED_UNKNOWN_COMMAND


class ParseResult(msgspec.Struct, frozen=True):
    valid: bool
    trace: list[TraceLine]


class Reporter:
    """The trace of one parse, which the parser's layers (blocks, statements, driver)
    append to."""

    def __init__(self) -> None:
        self.trace: list[TraceLine] = []

    def report(self, line: int, column: int, code: str, message: str, suggestion: str = "") -> None:
        self.trace.append(TraceLine(line, column, code, message, suggestion))

    def foreign(self, line: int, column: int, text: str, lang: str, hint: str, sugg: str) -> None:
        self.report(
            line,
            column,
            FOREIGN_SYNTAX,
            f"unexpected construct '{snippet(text)}' ({lang}) — {hint}",
            sugg,
        )


def unknown_message(name: str) -> str:
    return f"unknown command '{name}' — expected known identifier"


def snippet(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------- suggestions

_NAMES_LOWER: dict[str, str] = {name.lower(): name for name in COMMANDS}
_ALIASES_LOWER: dict[str, str] = {k.lower(): v for k, v in ALIASES.items()}


def suggest_command(name: str) -> str:
    """The AVAP command a misspelt or hallucinated name most likely meant, or ""."""
    if name in ALIASES:
        return ALIASES[name]
    low = name.lower()
    if low in _NAMES_LOWER:  # only the case differs (`addvar`, `requestGet`)
        return _NAMES_LOWER[low]
    if low in _ALIASES_LOWER:
        return _ALIASES_LOWER[low]
    close = difflib.get_close_matches(low, _NAMES_LOWER, n=1, cutoff=0.75)
    return _NAMES_LOWER[close[0]] if close else ""
