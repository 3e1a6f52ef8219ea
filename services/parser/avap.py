"""AVAP reference parser: a single line-by-line pass that yields a structured trace.

AVAP is line-oriented (one command per line), so validation needs no full grammar: each
line is classified with a few precompiled regexes plus one bracket/quote scan, and block
commands are tracked on a stack. The trace is meant for an LLM retry, so every diagnostic
names the construct, the reason and (where one exists) the AVAP replacement.

Two modes:

* strict: the language spec. Lines are command calls, `x = command(...)` or `//` comments;
  name parameters (`addVar(total, 0)`'s `total`) must be bare identifiers; `try()` needs
  `exception(var)` and `end()`.
* lenient: the looser dialect the AVAP Lite runtime executes (its test scripts): Python
  expression assignments (`x = a + b`, `t = "T-" + str(i)`), `x = exception(msg)`,
  `exception()` without arguments, an exception handler left open at end of input (or
  closed implicitly by an enclosing block's end), quoted variable names, `#` comments, bare
  `end`/`else`/`endLoop`/`try`, and `function name(a, b) { ... }` blocks with `return`.

Unknown commands fail in both modes, with one narrow lenient exception: inside a `try()`
body, a zero-argument call statement whose name is not a near miss of any command (the
Lite tests' `comandoInexistente()`) is accepted with a TOLERATED_UNKNOWN_COMMAND warning.
Such a call can do nothing but raise the runtime error the handler is there to catch. A
near miss (`getSHA256`) or a call with arguments (`sendEmail(to, body)`) inside a try is
still a hallucination and an UNKNOWN_COMMAND error. Warnings never make a program invalid.

The parser is layered, one module per concern: `scan` (quotes, brackets, comments of one
line), `foreign` (other languages' constructs), `diagnostics` (trace codes, the result,
command suggestions), `blocks` (the open-block stack), `statements` (assignments and
calls); this module is the driver that classifies each line and hands it on.
"""

from __future__ import annotations

import re

from services.parser.diagnostics import UNBALANCED_BRACKETS, ParseResult, suggest_command
from services.parser.foreign import FOREIGN_BY_KEYWORD, RESULT_HINT, foreign_in
from services.parser.scan import scan_line
from services.parser.statements import StatementParser
from shared.contracts.parser import WARNING_CODES, TraceLine

__all__ = ["ParseResult", "TraceLine", "suggest_command", "validate"]

_HEAD = re.compile(r"(?:[^\W\d]|\$)[\w$]*")
_FUNCTION_HEADER = re.compile(r"function\s+([^\W\d]\w*)\s*\(([^)]*)\)\s*\{\s*\Z")
# The common line, `[target =] command(plain, args)` with no quotes, brackets, escapes,
# slashes or colons, needs neither the scan nor the foreign checks: a fast path.
_SIMPLE_CALL = re.compile(r"(?:([^\W\d]\w*)\s*=\s*)?([^\W\d]\w*)\(([^\"'`()\[\]{}\\/;:]*)\)\Z")


class _Parser(StatementParser):
    """The driver: each line to the fast path, the first-word checks, the scanner and the
    foreign-construct checks, then `statement`."""

    def run(self, code: str) -> ParseResult:
        code = code.removeprefix("\ufeff")  # a BOM from a saved file is not code
        for n, raw in enumerate(code.splitlines(), 1):
            s = raw.strip()
            if not s or s.startswith("//"):
                continue
            self.line(n, len(raw) - len(raw.lstrip()) + 1, s)
        self.finish()
        trace = sorted(self.trace, key=lambda t: (t.line, t.column))
        return ParseResult(valid=all(t.code in WARNING_CODES for t in trace), trace=trace)

    def line(self, n: int, c: int, s: str) -> None:
        if s[0] == "#":
            if self.strict:
                self.foreign(n, c, s, "Python", "AVAP comments start with //", "//")
            return
        if self.simple_call(n, c, s):
            return
        head = _HEAD.match(s)
        word = head.group() if head else ""
        if self.by_first_word(n, c, s, word):
            return
        scan = scan_line(s)
        if scan.error:
            err, at, msg = scan.error
            if s.endswith("{") and err == UNBALANCED_BRACKETS:
                self.foreign(n, c, s, "JavaScript/Go", "AVAP blocks are not brace-delimited", "")
            else:
                self.report(n, c + at, err, msg)
            return
        code = scan.code
        if not code:
            return
        found = foreign_in(code)
        if found:
            at, lang, hint, sugg = found
            self.foreign(n, c + at, s, lang, hint, sugg)
            return
        self.statement(n, c, s, scan, word)

    def simple_call(self, n: int, c: int, s: str) -> bool:
        """The fast path: a plain `[target = ]command(args)` line (no quotes, no nesting)
        goes straight to `call`."""
        fast = _SIMPLE_CALL.match(s)
        if (
            fast
            and fast.group(2) not in FOREIGN_BY_KEYWORD
            and fast.group(2) != "return"
            and not ("=>" in (inner := fast.group(3)) or "===" in inner or "!==" in inner)
        ):
            args = [a.strip() for a in inner.split(",")] if inner.strip() else []
            self.call(n, c + fast.start(2), fast.group(2), args, args, fast.group(1) or "")
            return True
        return False

    def by_first_word(self, n: int, c: int, s: str, word: str) -> bool:
        """Lines told by their first word: lenient user functions, then other languages'
        constructs (`return`, their keywords, a `}` closer)."""
        if not self.strict and self.user_function_line(n, c, s, word):
            return True
        if word == "return":
            where = "outside a function " if not self.strict else ""
            self.foreign(
                n,
                c,
                s,
                "Python/JavaScript/Go",
                f"'return' {where}is not AVAP; {RESULT_HINT}",
                "addResult",
            )
            return True
        rules = FOREIGN_BY_KEYWORD.get(word)
        if rules:
            for rx, lang, hint, sugg in rules:
                if rx.match(s):
                    self.foreign(n, c, s, lang, hint, sugg)
                    return True
        if s[0] == "}":
            self.foreign(
                n, c, s, "JavaScript/Go", "AVAP blocks close with end() / endLoop()", "end"
            )
            return True
        return False

    def user_function_line(self, n: int, c: int, s: str, word: str) -> bool:
        """Lenient mode's `function name(params) {`, its closing `}` and a `return` inside
        it (accepted as it is)."""
        if word == "function":
            fm = _FUNCTION_HEADER.match(s)
            if fm:
                self.open_function(n, c, fm.group(1), fm.group(2))
                return True
        elif s == "}" and any(f.kind == "func" for f in self.stack):
            self.close_block(n, c, "}", ("func",))
            return True
        elif word == "return" and any(f.kind == "func" for f in self.stack):
            return True
        return False

    def finish(self) -> None:
        self.report_unclosed()
        self.resolve_pending()


def validate(code: str, *, strict: bool = False) -> ParseResult:
    """Validate an AVAP program. `valid` is False iff the trace holds an error."""
    return _Parser(strict).run(code)
