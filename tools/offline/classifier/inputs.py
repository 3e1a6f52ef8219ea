"""JSONL inputs of the offline evaluations, read strictly: a malformed line is one
`InputError` naming the file, the line number and the field, never a traceback.

Optional fields may be `null` (or absent); each evaluation's line type says which
fields are optional by giving them a default.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TypeVar

import msgspec

from shared.contracts.routing import HISTORY_WINDOW, HistoryEntry, QueryType, topic_snippet

T = TypeVar("T")

_AT = re.compile(r"\s*-\s*at `\$\.?([^`]*)`\s*$")
_MISSING = re.compile(r"missing required field `([^`]+)`")


class InputError(ValueError):
    """A file the evaluation cannot read, or one malformed line of it."""

    def __init__(self, path: Path | str, line: int, field: str, problem: str) -> None:
        super().__init__(f"{path}:{line}: {field}: {problem}" if line
                         else f"{path}: {problem}")
        self.path, self.line, self.field, self.problem = str(path), line, field, problem


def _field_and_problem(message: str) -> tuple[str, str]:
    """msgspec's "Expected `str`, got `int` - at `$.history[0].type`" as
    ("history[0].type", "expected `str`, got `int`")."""
    at = _AT.search(message)
    if at:
        return at.group(1) or "(line)", message[:at.start()].strip()
    missing = _MISSING.search(message)
    if missing:
        return missing.group(1), "missing (required)"
    return "(line)", message


def read_lines(path: Path) -> list[tuple[int, bytes]]:
    """(line number, bytes) of the non-blank lines of `path`."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InputError(path, 0, "", exc.strerror or str(exc)) from None
    return [(n, raw) for n, raw in enumerate(data.splitlines(), 1) if raw.strip()]


def decode_jsonl(path: Path, line_type: type[T]) -> list[T]:
    """Every non-blank line of `path` decoded as `line_type` (unknown keys ignored)."""
    decoder = msgspec.json.Decoder(line_type)
    out: list[T] = []
    for n, raw in read_lines(path):
        try:
            out.append(decoder.decode(raw))
        except msgspec.ValidationError as exc:
            field, problem = _field_and_problem(str(exc))
            raise InputError(path, n, field, problem) from None
        except msgspec.DecodeError:
            raise InputError(path, n, "(line)", "not valid JSON") from None
    return out


class HistoryItem(msgspec.Struct):
    """One intent-history turn of an input line; the topic may be null."""

    type: QueryType
    topic: str | None = None


def history_entries(raw: list[HistoryItem] | None) -> list[HistoryEntry]:
    """An input line's history as the classifier reads it: at most the last 6 (RC-06)."""
    entries = [HistoryEntry(h.type, topic_snippet(h.topic or "")) for h in raw or []]
    return entries[-HISTORY_WINDOW:]
