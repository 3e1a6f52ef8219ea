"""Ids that become part of a subject (agent, request) or a key (session): one rule,
checked wherever they enter (the gateway and every stage)."""

from __future__ import annotations

import re

MAX_ID_CHARS = 128
# One subject token: no `.`, `*`, `>`, whitespace or control characters; nothing a
# database column of ids cannot hold.
_ID = re.compile(r"[A-Za-z0-9_-]+")
# Subject tokens with a meaning of their own (`agent.response.<agent>._invalid`).
RESERVED_IDS = frozenset({"_invalid"})
# A part of a message carrying several requests (issue 34) is stored under its message's
# request id and its place, `<request_id>#<place from 1>`: its classify_history entry and
# an agent's verdict on it. `#` is no id character, so no request id is ever a part's,
# and a part's id is a little longer than a request id may be.
PART_MARK = "#"
MAX_PART_ID_CHARS = MAX_ID_CHARS + 12


def part_id(request_id: str, index: int) -> str:
    """The stored id of part `index` (from 0, as its marker and the final chunk number it)
    of request `request_id`."""
    return f"{request_id}{PART_MARK}{index + 1}"


def id_problem(name: str, value: str) -> str:
    """Why `value` cannot be the `name` id ("" when it can)."""
    if not value:
        return f"field '{name}' is required and empty"
    if len(value) > MAX_ID_CHARS:
        return f"field '{name}' exceeds {MAX_ID_CHARS} characters"
    if not _ID.fullmatch(value) or value in RESERVED_IDS:
        return f"field '{name}' may only hold letters, digits, '-' and '_'"
    return ""


def is_valid_id(value: str) -> bool:
    return bool(value) and len(value) <= MAX_ID_CHARS and bool(_ID.fullmatch(value)) and (
        value not in RESERVED_IDS)
