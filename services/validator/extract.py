"""Pull the AVAP program out of a generated answer, for the parser.

Fenced blocks win, in this order: blocks tagged `avap`; else untagged (or `text`) blocks
that contain a command-shaped line; else blocks tagged with any other language that do
(an LLM that labels AVAP as ```python still produced code the user will run). All blocks of
the winning tier are joined, so the parser sees every snippet the user sees; trace line
numbers then count within that joined text.

Without fences, the longest run of command-shaped lines (comments, blank lines and
assignments allowed inside a run) is taken. The shape test is syntactic on purpose: the
validator must not import the parser service's command table, and a hallucinated command
line is exactly what must reach the parser.
"""

from __future__ import annotations

import re

# An opening fence, its info string, the body, and the matching closing fence (or the end of
# the text: a truncated answer still has code worth checking).
_FENCE = re.compile(
    r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[^\n`]*)\n"
    r"(?P<body>.*?)"
    r"(?:^[ \t]*(?P=fence)[ \t]*$|\Z)",
    re.MULTILINE | re.DOTALL,
)
_CALL_LINE = re.compile(
    r"[ \t]*(?:[^\W\d]\w*[ \t]*=[ \t]*)?[^\W\d]\w*[ \t]*\(.*\)[ \t]*(?://.*)?\Z"
)
_COMMENT_LINE = re.compile(r"[ \t]*//")
_ASSIGN_LINE = re.compile(r"[ \t]*[^\W\d]\w*[ \t]*=[^=].*\Z")
_PLAIN_TAGS = frozenset({"", "text", "txt", "plaintext", "code"})


def _has_command_line(body: str) -> bool:
    return any(_CALL_LINE.match(line) for line in body.splitlines())


def _fenced(answer: str) -> str | None:
    tiers: tuple[list[str], list[str], list[str]] = ([], [], [])
    for m in _FENCE.finditer(answer):
        info = m.group("lang").split()
        lang = info[0].lower() if info else ""
        body = m.group("body").rstrip("\n")
        if lang == "avap":
            tiers[0].append(body)
        elif _has_command_line(body):
            tiers[1 if lang in _PLAIN_TAGS else 2].append(body)
    for blocks in tiers:
        if blocks:
            return "\n".join(blocks)
    return None


def _longest_run(answer: str) -> str:
    lines = answer.splitlines()
    best = (0, 0)  # [start, end) line indexes
    start = last = -1  # first and last command line of the current run
    for i, line in enumerate(lines):
        if _CALL_LINE.match(line):
            if start < 0:
                start = i
            last = i
        elif start >= 0 and (
            not line.strip() or _COMMENT_LINE.match(line) or _ASSIGN_LINE.match(line)
        ):
            continue  # may continue the run; dropped again if no command line follows
        else:
            if start >= 0 and last + 1 - start > best[1] - best[0]:
                best = (start, last + 1)
            start = -1
    if start >= 0 and last + 1 - start > best[1] - best[0]:
        best = (start, last + 1)
    s, e = best
    while s > 0 and _COMMENT_LINE.match(lines[s - 1]):  # a comment heading the program
        s -= 1
    return "\n".join(lines[s:e])


def extract_avap_code(answer: str) -> str:
    """The AVAP code in `answer`, or "" when it holds none."""
    if not answer:
        return ""
    fenced = _fenced(answer)
    if fenced is not None:
        return fenced
    return _longest_run(answer)
