"""The AVAP parser's line scanner: the quote and bracket facts of one stripped line
(`Scan`), from one pass over its special characters.

It finds the first top-level call's parentheses and commas, masks string contents so that
later checks never look inside literals, drops a trailing `//` comment, and reports the
first unterminated string or unbalanced bracket.
"""

from __future__ import annotations

import re

from services.parser.diagnostics import SYNTAX_ERROR, UNBALANCED_BRACKETS, UNTERMINATED_STRING

_SPECIAL = re.compile(r"[\"'`()\[\]{},\\]|//")
_OPENERS = {"(": ")", "[": "]", "{": "}"}
_CLOSERS = {")": "(", "]": "[", "}": "{"}


class Scan:
    """Quote/bracket facts of one stripped line, from one pass over its special characters."""

    __slots__ = ("code", "commas", "error", "first_close", "first_open")

    def __init__(self) -> None:
        self.code = ""  # the line without its trailing comment, string contents masked
        self.first_open = -1  # the first top-level "(" ...
        self.first_close = -1  # ... and its matching ")"
        self.commas: list[int] = []  # top-level commas inside that pair
        self.error: tuple[str, int, str] | None = None


def _closing_quote(s: str, start: int, quote: str) -> int:
    j = start + 1
    while True:
        k = s.find(quote, j)
        if k < 0:
            return -1
        backslashes = 0
        while s[k - 1 - backslashes] == "\\":
            backslashes += 1
        if backslashes % 2 == 0:
            return k
        j = k + 1


def scan_line(s: str) -> Scan:
    out = Scan()
    stack: list[tuple[str, int]] = []
    strings: list[tuple[int, int]] = []
    skip_to = 0
    code_end = len(s)
    for m in _SPECIAL.finditer(s):
        i = m.start()
        if i < skip_to:
            continue
        tok = m.group()
        if tok == "\\":  # escapes the next character (regex arguments such as \( )
            skip_to = i + 2
        elif tok == "//":
            if not stack:  # a trailing comment; "//" inside arguments is a URL
                code_end = i
                break
        elif tok in "\"'`":
            if tok == "'" and i and s[i - 1].isalnum():
                continue  # an apostrophe inside an unquoted word (don't)
            j, out.error = _string_at(s, i, tok)
            if out.error:
                return out
            strings.append((i, j))
            skip_to = j + 1
        else:
            out.error = _bracket(out, stack, tok, i)
            if out.error:
                return out
    if stack:
        opener, at = stack[-1]
        out.error = (UNBALANCED_BRACKETS, at, f"'{opener}' is never closed")
        return out
    out.code = _masked_code(s, strings, code_end)
    return out


def _string_at(s: str, i: int, quote: str) -> tuple[int, tuple[str, int, str] | None]:
    """The end of the string literal opening at `i`, or the error that it has none (or,
    for a template string, that a `${` in it is never closed)."""
    j = _closing_quote(s, i, quote)
    if j < 0:
        return j, (UNTERMINATED_STRING, i, f"unterminated string starting with {quote}")
    if quote == "`":
        body = s[i + 1 : j]
        k = body.find("${")
        while k >= 0:
            close = body.find("}", k)
            if close < 0:
                return j, (SYNTAX_ERROR, i + 1 + k, "unclosed '${' in template string")
            k = body.find("${", close)
    return j, None


def _bracket(
    out: Scan, stack: list[tuple[str, int]], tok: str, i: int
) -> tuple[str, int, str] | None:
    """A comma, opener or closer at `i`: the bracket stack and the first top-level call's
    parentheses and commas kept in `out`; the error if a closer matches nothing."""
    if tok == ",":
        if len(stack) == 1 and stack[0][1] == out.first_open:
            out.commas.append(i)
    elif tok in _OPENERS:
        if tok == "(" and not stack and out.first_open < 0:
            out.first_open = i
        stack.append((tok, i))
    else:  # a closer
        if not stack:
            return (UNBALANCED_BRACKETS, i, f"'{tok}' has no matching '{_CLOSERS[tok]}'")
        opener, at = stack.pop()
        if _OPENERS[opener] != tok:
            return (
                UNBALANCED_BRACKETS,
                i,
                f"'{tok}' does not match '{opener}' opened at column {at + 1}",
            )
        if not stack and at == out.first_open:
            out.first_close = i
    return None


def _masked_code(s: str, strings: list[tuple[int, int]], code_end: int) -> str:
    """The line before its trailing comment, string contents masked so that later checks
    never look inside literals."""
    if not strings:
        return s[:code_end].rstrip()
    parts: list[str] = []
    prev = 0
    for a, b in strings:
        if a >= code_end:
            break
        parts.append(s[prev : a + 1])
        parts.append("_" * (b - a - 1))
        prev = b
    parts.append(s[prev:code_end])
    return "".join(parts).rstrip()
