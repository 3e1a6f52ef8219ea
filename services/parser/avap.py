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
"""

from __future__ import annotations

import difflib
import re

import msgspec

from services.parser.commands import ALIASES, BLOCK_COMMANDS, COMMANDS, COMPARATORS
from shared.contracts.parser import WARNING_CODES, TraceCode, TraceLine

__all__ = ["ParseResult", "TraceLine", "suggest_command", "validate"]



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


# --------------------------------------------------------------------------- regexes
# Identifiers are `[^\W\d]\w*`: Unicode letters are allowed (`año`), as in the runtime's
# Python namespace.

_HEAD = re.compile(r"(?:[^\W\d]|\$)[\w$]*")
_IDENT = re.compile(r"[^\W\d]\w*\Z")
_ASSIGN = re.compile(r"([^\W\d]\w*)\s*=(?!=)\s*")
_CALL_HEAD = re.compile(r"([^\W\d][\w.]*)\s*\(")
_EXPR_CALL = re.compile(r"(?<![\w.])([^\W\d][\w.]*)\s*\(")
_ATTRIBUTE = re.compile(r"(?<![\w.])[^\W\d]\w*\.[^\W\d]")
_COMPOUND = re.compile(r"[^\W\d][\w.\[\]]*\s*(?:[-+*/%]=|\+\+|--)")
_BAD_TARGET = re.compile(r"[^\W\d]\w*(?:\.\w+|\[[^\]]*\])+\s*=(?!=)")
_FSTRING = re.compile(r"(?<![\w$])[fF][rR]?[\"']")
_RHS_FOREIGN = re.compile(r"(await|new|lambda|function|yield)\b")
_NEW_OBJECT = re.compile(r"\bnew\s+[A-Z]")
_FUNCTION_HEADER = re.compile(r"function\s+([^\W\d]\w*)\s*\(([^)]*)\)\s*\{\s*\Z")
# The common line, `[target =] command(plain, args)` with no quotes, brackets, escapes,
# slashes or colons, needs neither the scan nor the foreign checks: a fast path.
_SIMPLE_CALL = re.compile(r"(?:([^\W\d]\w*)\s*=\s*)?([^\W\d]\w*)\(([^\"'`()\[\]{}\\/;:]*)\)\Z")
_SPECIAL = re.compile(r"[\"'`()\[\]{},\\]|//")
_OPENERS = {"(": ")", "[": "]", "{": "}"}
_CLOSERS = {")": "(", "]": "[", "}": "{"}

# Keyword-led foreign constructs, checked only when the line's first word is a key here
# (so ordinary command lines pay a single dict lookup). Each entry: regex on the stripped
# line, language, hint, AVAP replacement.
_LOOP_HINT = "AVAP loop syntax required: startLoop(var, from, to) ... endLoop()"
_RESULT_HINT = "AVAP returns values with addResult(var)"
_ForeignRule = tuple[re.Pattern[str], str, str, str]


def _rules(*rules: tuple[str, str, str, str]) -> list[_ForeignRule]:
    return [(re.compile(p), lang, hint, sugg) for p, lang, hint, sugg in rules]


_FOREIGN_BY_KEYWORD: dict[str, list[_ForeignRule]] = {
    "for": _rules(
        (r"for\s+[\w\s,()]+\s+in\s", "Python", _LOOP_HINT, "startLoop"),
        (r"for\b.*:=", "Go", _LOOP_HINT, "startLoop"),
        (r"for\s*\(|for\s+\w+.*\{\s*\Z", "JavaScript", _LOOP_HINT, "startLoop"),
        (r"for\s+\w", "Python", _LOOP_HINT, "startLoop"),
    ),
    "while": _rules((r"while\b", "Python/JavaScript", _LOOP_HINT, "startLoop")),
    "def": _rules(
        (r"def\s+\w+", "Python", "AVAP has no 'def'; write the commands inline", ""),
    ),
    "import": _rules(
        (r"import\s*\(|import\s+\"", "Go", "AVAP has no imports; commands are built in", ""),
        (r"import\b.*\bfrom\s+[\"']", "JavaScript", "AVAP has no imports", ""),
        (r"import\s+[\w.]+", "Python", "AVAP has no imports; commands are built in", ""),
    ),
    "from": _rules((r"from\s+[\w.]+\s+import\b", "Python", "AVAP has no imports", "")),
    "package": _rules((r"package\s+\w+\s*\Z", "Go", "AVAP programs have no package clause", "")),
    "func": _rules(
        (r"func\b", "Go", "AVAP has no function declarations; write commands inline", "")
    ),
    "print": _rules((r"print\s*[(\"']", "Python", _RESULT_HINT, "addResult")),
    "println": _rules((r"println\s*\(", "Go/Java", _RESULT_HINT, "addResult")),
    "elif": _rules((r"elif\b", "Python", "nest if(...) inside else() ... end()", "else")),
    "else": _rules(
        (r"else\s+if\b", "JavaScript/Go", "nest if(...) inside else() ... end()", "else"),
    ),
    "if": _rules(
        (
            r"if\s+[^(\s]",
            "Python/Go",
            "AVAP conditions are if(variable, value, comparator) ... end()",
            "if",
        ),
    ),
    "except": _rules(
        (
            r"except\b",
            "Python",
            "handle errors with try() ... exception(var) ... end()",
            "exception",
        ),
    ),
    "catch": _rules(
        (
            r"catch\b",
            "JavaScript",
            "handle errors with try() ... exception(var) ... end()",
            "exception",
        ),
    ),
    "finally": _rules((r"finally\b", "Python/JavaScript", "AVAP has no finally block", "end")),
    "raise": _rules((r"raise\b", "Python", "AVAP has no raise; set an error variable", "addVar")),
    "throw": _rules(
        (r"throw\b", "JavaScript", "AVAP has no throw; set an error variable", "addVar")
    ),
    "pass": _rules((r"pass\s*\Z", "Python", "AVAP has no 'pass'; remove the line", "")),
    "with": _rules((r"with\s+.+:\s*\Z", "Python", "AVAP has no context managers", "")),
    "class": _rules((r"class\s+\w+", "Python/JavaScript", "AVAP has no classes", "")),
    "lambda": _rules((r"lambda\b", "Python", "AVAP has no lambdas", "")),
    "async": _rules((r"async\s+\w", "Python/JavaScript", "AVAP commands are synchronous", "")),
    "await": _rules((r"await\s+\w", "Python/JavaScript", "AVAP commands are synchronous", "")),
    "defer": _rules((r"defer\s+\w", "Go", "AVAP has no defer", "")),
    "switch": _rules((r"switch\b", "JavaScript/Go", "use if(...) ... else() ... end()", "if")),
    "case": _rules((r"case\s+.*:\s*\Z", "JavaScript/Go", "use if(...) ... else() ... end()", "if")),
    "const": _rules(
        (r"const\s+[\w${\[]", "JavaScript", "declare variables with addVar(name, value)", "addVar")
    ),
    "let": _rules(
        (r"let\s+[\w${\[]", "JavaScript", "declare variables with addVar(name, value)", "addVar")
    ),
    "var": _rules(
        (r"var\s+[\w$]", "JavaScript/Go", "declare variables with addVar(name, value)", "addVar")
    ),
    "console": _rules((r"console\.\w+", "JavaScript", _RESULT_HINT, "addResult")),
    "fmt": _rules((r"fmt\.\w+", "Go", _RESULT_HINT, "addResult")),
    "function": _rules(
        (
            r"function\b",
            "JavaScript",
            "AVAP has no functions in strict mode; write commands inline",
            "",
        ),
    ),
}

# Module prefixes whose dotted calls reveal the source language in the message.
_DOTTED_LANG = {
    "console": "JavaScript",
    "JSON": "JavaScript",
    "Math": "JavaScript",
    "document": "JavaScript",
    "window": "JavaScript",
    "fmt": "Go",
    "strings": "Go",
    "strconv": "Go",
    "http": "Go",
    "os": "Python",
    "json": "Python",
    "requests": "Python",
    "hashlib": "Python",
    "datetime": "Python",
    "re": "Python",
    "time": "Python",
}

_BLOCK_CLOSER = {"if": "end()", "loop": "endLoop()", "try": "end()", "exc": "end()", "func": "}"}
_BLOCK_LABEL = {
    "if": "if()",
    "loop": "startLoop()",
    "try": "try()",
    "exc": "try()/exception()",
    "func": "function",
}
_EXPR_BUILTINS = frozenset({"str", "int", "float", "len"})  # what the Lite runtime evaluates
_LENIENT_BARE = frozenset({"end", "else", "endLoop", "try"})


def _unknown_message(name: str) -> str:
    return f"unknown command '{name}' — expected known identifier"


def _snippet(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------- line scanning


class _Scan:
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


def _scan(s: str) -> _Scan:
    out = _Scan()
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
    out: _Scan, stack: list[tuple[str, int]], tok: str, i: int
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


# --------------------------------------------------------------------------- parser


class _Frame:
    __slots__ = ("closed_by_mismatch", "column", "has_else", "kind", "line")

    def __init__(self, kind: str, line: int, column: int) -> None:
        self.kind = kind  # "if" | "loop" | "try" | "exc" | "func"
        self.line = line
        self.column = column
        self.has_else = False
        # Set when a mismatched closer popped the frame above this one while matching this
        # frame's kind: that closer was probably meant for it, so it is not reported again.
        self.closed_by_mismatch = False


class _Parser:
    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.trace: list[TraceLine] = []
        self.stack: list[_Frame] = []
        self.functions: dict[str, int] = {}  # lenient user functions: name -> arity
        # Lenient unknown calls wait for the end, since a function may be defined further
        # down: (line, column, name, argument count or -1, is a zero-argument call in a try).
        self.pending: list[tuple[int, int, str, int, bool]] = []

    # -- reporting

    def report(self, line: int, column: int, code: str, message: str, suggestion: str = "") -> None:
        self.trace.append(TraceLine(line, column, code, message, suggestion))

    def foreign(self, line: int, column: int, text: str, lang: str, hint: str, sugg: str) -> None:
        self.report(
            line,
            column,
            FOREIGN_SYNTAX,
            f"unexpected construct '{_snippet(text)}' ({lang}) — {hint}",
            sugg,
        )

    # -- driver

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
        scan = _scan(s)
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
        if self.content_foreign(n, c, code, s):
            return
        self.statement(n, c, s, scan, word)

    def simple_call(self, n: int, c: int, s: str) -> bool:
        """The fast path: a plain `[target = ]command(args)` line (no quotes, no nesting)
        goes straight to `call`."""
        fast = _SIMPLE_CALL.match(s)
        if (
            fast
            and fast.group(2) not in _FOREIGN_BY_KEYWORD
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
                f"'return' {where}is not AVAP; {_RESULT_HINT}",
                "addResult",
            )
            return True
        rules = _FOREIGN_BY_KEYWORD.get(word)
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

    def statement(self, n: int, c: int, s: str, scan: _Scan, word: str) -> None:
        """A scanned line without foreign constructs: an assignment or a command call, else
        the error saying which statement it fails to be."""
        code = scan.code
        am = _ASSIGN.match(code)
        if am:
            self.assignment(n, c, s, scan, am)
            return
        cm = _CALL_HEAD.match(code)
        if cm and cm.end() - 1 == scan.first_open:
            if scan.first_close != len(code) - 1:
                tail = code[scan.first_close + 1 :]
                at = scan.first_close + 1 + len(tail) - len(tail.lstrip())
                self.report(
                    n,
                    c + at,
                    SYNTAX_ERROR,
                    f"unexpected text after ')': '{_snippet(code[at:].strip())}'",
                )
                return
            self.call_scanned(n, c, cm.group(1), s, scan, target="")
            return
        if _IDENT.match(code):
            if not self.strict and code in _LENIENT_BARE:
                self.block(n, c, code)
            elif code in COMMANDS:
                self.report(
                    n,
                    c,
                    SYNTAX_ERROR,
                    f"missing parentheses: '{code}' must be called as a command",
                    COMMANDS[code].signature(),
                )
            else:
                self.report(
                    n,
                    c,
                    SYNTAX_ERROR,
                    f"unrecognized statement '{_snippet(code)}' — expected command(...)",
                )
            return
        if _BAD_TARGET.match(code):
            self.report(
                n,
                c,
                INVALID_ASSIGNMENT,
                f"cannot assign to '{_snippet(code.split('=')[0].strip())}' — set JSON keys with "
                "AddvariableToJSON(key, value, target)",
                "AddvariableToJSON",
            )
            return
        if word in COMMANDS:
            self.report(
                n,
                c,
                SYNTAX_ERROR,
                f"'{word}' must be called with parentheses",
                COMMANDS[word].signature(),
            )
            return
        self.report(
            n, c, SYNTAX_ERROR, f"unrecognized statement '{_snippet(s)}' — expected command(...)"
        )

    def content_foreign(self, n: int, c: int, code: str, s: str) -> bool:
        """Foreign constructs anywhere in a line: detected on `code` (strings masked),
        quoted from the source line `s`."""
        if code.endswith(";"):
            self.foreign(
                n, c + len(code) - 1, s, "JavaScript/Go", "AVAP lines have no ';' terminator", ""
            )
        elif code.endswith(":"):
            self.foreign(
                n,
                c,
                s,
                "Python",
                "AVAP blocks are if(...)/startLoop(...)/try() closed by end()",
                "",
            )
        elif ":=" in code:
            self.foreign(
                n,
                c + code.index(":="),
                s,
                "Go",
                "assign with addVar(name, value) or x = command(...)",
                "addVar",
            )
        elif "=>" in code:
            self.foreign(
                n, c + code.index("=>"), s, "JavaScript", "AVAP has no arrow functions", ""
            )
        elif "===" in code or "!==" in code:
            self.foreign(
                n, c, s, "JavaScript", "compare inside if(variable, value, comparator)", "if"
            )
        elif _COMPOUND.match(code):
            self.foreign(
                n,
                c,
                s,
                "Python/JavaScript/Go",
                "update variables with addVar(name, value)",
                "addVar",
            )
        elif ('f"' in code or "f'" in code or 'F"' in code) and _FSTRING.search(code):
            self.foreign(
                n, c, s, "Python", "build strings with backtick templates `text ${var}`", ""
            )
        elif "new " in code and _NEW_OBJECT.search(code):
            self.foreign(
                n, c, s, "JavaScript", "AVAP has no objects; use the built-in commands", ""
            )
        else:
            return False
        return True

    # -- statements

    def assignment(self, n: int, c: int, s: str, scan: _Scan, am: re.Match[str]) -> None:
        target = am.group(1)
        code = scan.code
        rhs_at = am.end()
        if rhs_at >= len(code):
            self.report(n, c, INVALID_ASSIGNMENT, f"assignment to '{target}' has no value")
            return
        cm = _CALL_HEAD.match(code, rhs_at)
        if cm and cm.end() - 1 == scan.first_open and scan.first_close == len(code) - 1:
            self.call_scanned(n, c + rhs_at, cm.group(1), s, scan, target=target)
            return
        rhs = code[rhs_at:]
        for em in _EXPR_CALL.finditer(rhs):
            name = em.group(1)
            if "." in name:
                self.dotted(n, c + rhs_at + em.start(), name)
                return
        rf = _RHS_FOREIGN.match(rhs)
        if rf:
            self.foreign(n, c + rhs_at, s, "JavaScript/Python", f"AVAP has no '{rf.group(1)}'", "")
            return
        if "?" in rhs:
            self.foreign(n, c, s, "JavaScript", "AVAP has no ternary operator; use if(...)", "if")
            return
        am2 = _ATTRIBUTE.search(rhs)
        if am2:
            self.foreign(
                n,
                c + rhs_at + am2.start(),
                s,
                "Python/JavaScript",
                "read JSON keys with variableFromJSON(source, key, target)",
                "variableFromJSON",
            )
            return
        if self.strict:
            self.report(
                n,
                c,
                INVALID_ASSIGNMENT,
                f"strict AVAP assigns only command results (x = command(...)); got '{_snippet(s)}'",
                f"addVar({target}, ...)",
            )
            return
        for em in _EXPR_CALL.finditer(rhs):
            name = em.group(1)
            if name not in _EXPR_BUILTINS and name not in COMMANDS:
                self.pending.append((n, c + rhs_at + em.start(), name, -1, False))

    def dotted(self, n: int, c: int, name: str) -> None:
        lang = _DOTTED_LANG.get(name.split(".", 1)[0], "Python/JavaScript")
        hint = (
            _RESULT_HINT
            if name in ("console.log", "fmt.Println", "fmt.Printf")
            else ("AVAP has no modules or methods; use the built-in commands")
        )
        sugg = "addResult" if hint is _RESULT_HINT else ""
        self.foreign(n, c, f"{name}(...)", lang, hint, sugg)

    def call_scanned(self, n: int, c: int, name: str, s: str, scan: _Scan, target: str) -> None:
        code = scan.code
        inner_from = scan.first_open + 1
        if code[inner_from : scan.first_close].strip():
            bounds = [inner_from, *(k + 1 for k in scan.commas), scan.first_close + 1]
            args = [code[bounds[i] : bounds[i + 1] - 1].strip() for i in range(len(bounds) - 1)]
            raw_args = [s[bounds[i] : bounds[i + 1] - 1].strip() for i in range(len(bounds) - 1)]
        else:
            args = raw_args = []
        self.call(n, c, name, args, raw_args, target)

    def call(
        self, n: int, c: int, name: str, args: list[str], raw_args: list[str], target: str
    ) -> None:
        """A command call; `c` is the column of the command name. `args` have string
        contents masked, `raw_args` are the source text."""
        if "." in name:
            self.dotted(n, c, name)
            return
        cmd = COMMANDS.get(name)
        if cmd is None:
            sugg = suggest_command(name)
            if sugg in BLOCK_COMMANDS:
                # `endIf()` / `End()` / `catch(e)`: report it, then apply the block command it
                # stands for so the structure stays right and errors do not cascade.
                self.report(n, c, UNKNOWN_COMMAND, _unknown_message(name), sugg)
                self.block(n, c, sugg)
            elif self.strict:
                self.report(n, c, UNKNOWN_COMMAND, _unknown_message(name), sugg)
            else:
                # Decided at the end: it may be a function defined further down.
                probe = not args and not target and self.in_try()
                self.pending.append((n, c, name, len(args), probe))
            return
        if target and name in BLOCK_COMMANDS and (self.strict or name != "exception"):
            self.report(
                n,
                c,
                INVALID_ASSIGNMENT,
                f"'{name}' is a block command and cannot be assigned to '{target}'",
                f"{name}(...)",
            )
        expected = cmd.arity
        ok_count = len(args) == expected or (
            not self.strict and name == "exception" and len(args) == 0
        )
        if not ok_count:
            self.report(
                n,
                c,
                ARG_COUNT,
                f"'{name}' expects {expected} argument{'s' if expected != 1 else ''} "
                f"({', '.join(p.name for p in cmd.params) or 'none'}) but got {len(args)}",
                cmd.signature(),
            )
        elif len(args) == expected:
            self.check_args(n, c, name, args, raw_args)
        if name in BLOCK_COMMANDS:
            self.block(n, c, name)

    def check_args(self, n: int, c: int, name: str, args: list[str], raw_args: list[str]) -> None:
        cmd = COMMANDS[name]
        for arg, raw, param in zip(args, raw_args, cmd.params, strict=True):
            if "(" in arg:
                cm = _CALL_HEAD.match(arg)
                if cm and "." in cm.group(1):
                    self.dotted(n, c, cm.group(1))
                    return
                if (
                    cm
                    and self.strict
                    and (cm.group(1) in COMMANDS or cm.group(1) in _EXPR_BUILTINS)
                ):
                    self.report(
                        n,
                        c,
                        INVALID_ARGUMENT,
                        f"nested call '{_snippet(raw)}' in {name}() — call the command on its own "
                        "line and pass its target variable",
                    )
                    return
            if self.strict and param.is_name and not _IDENT.match(arg):
                bare = raw.strip("\"'`")
                self.report(
                    n,
                    c,
                    INVALID_ARGUMENT,
                    f"{name}() parameter '{param.name}' must be a variable name, "
                    f"got '{_snippet(raw)}'",
                    bare if _IDENT.match(bare) else "",
                )
                return
        if name == "if":
            comparator = raw_args[2]
            if (
                not self.strict
                and len(comparator) >= 2
                and comparator[0] == comparator[-1] in "\"'"
            ):
                comparator = comparator[1:-1]
            if comparator not in COMPARATORS:
                self.report(
                    n,
                    c,
                    INVALID_ARGUMENT,
                    f"if() comparator must be one of {' '.join(sorted(COMPARATORS))}, "
                    f"got '{_snippet(raw_args[2])}'",
                    "if(variable, value, comparator)",
                )

    # -- blocks

    def in_try(self) -> bool:
        return any(f.kind == "try" for f in self.stack)

    def open_function(self, n: int, c: int, name: str, params: str) -> None:
        if any(f.kind == "func" for f in self.stack):
            self.report(n, c, SYNTAX_ERROR, f"function '{name}' defined inside another function")
            return
        self.functions[name] = len([p for p in params.split(",") if p.strip()])
        self.stack.append(_Frame("func", n, c))

    def block(self, n: int, c: int, name: str) -> None:
        if name == "if":
            self.stack.append(_Frame("if", n, c))
        elif name == "startLoop":
            self.stack.append(_Frame("loop", n, c))
        elif name == "try":
            self.stack.append(_Frame("try", n, c))
        elif name == "end":
            self.close_block(n, c, "end()", ("if", "try", "exc"))
        elif name == "endLoop":
            self.close_block(n, c, "endLoop()", ("loop",))
        elif name == "else":
            self.else_(n, c)
        elif name == "exception":
            self.exception(n, c)

    def drop_lenient_handlers(self, keep: tuple[str, ...]) -> None:
        # Lenient: an open exception handler ends where its enclosing block ends.
        if not self.strict:
            while self.stack and self.stack[-1].kind == "exc" and "exc" not in keep:
                self.stack.pop()

    def close_block(self, n: int, c: int, closer: str, kinds: tuple[str, ...]) -> None:
        self.drop_lenient_handlers(kinds)
        if not self.stack:
            self.report(n, c, UNEXPECTED_BLOCK_END, f"{closer} without an open block")
            return
        top = self.stack[-1]
        if top.kind in kinds:
            self.stack.pop()
            if top.kind == "try" and self.strict:
                self.report(
                    n,
                    c,
                    SYNTAX_ERROR,
                    f"try() opened at line {top.line} is closed without an exception(var) handler",
                    "exception",
                )
            return
        self.stack.pop()  # assume the closer was meant for the innermost block
        below = self.stack[-1] if self.stack else None
        if below is not None and below.kind in kinds:
            below.closed_by_mismatch = True
        self.report(
            n,
            c,
            UNEXPECTED_BLOCK_END,
            f"{closer} cannot close {_BLOCK_LABEL[top.kind]} opened at line {top.line} — "
            f"close it with {_BLOCK_CLOSER[top.kind]}",
            _BLOCK_CLOSER[top.kind],
        )

    def else_(self, n: int, c: int) -> None:
        self.drop_lenient_handlers(())
        top = self.stack[-1] if self.stack else None
        if top is None or top.kind != "if":
            where = (
                f" (innermost open block: {_BLOCK_LABEL[top.kind]} at line {top.line})"
                if top
                else ""
            )
            self.report(n, c, UNEXPECTED_BLOCK_END, f"else() without a matching if(){where}", "if")
        elif top.has_else:
            self.report(
                n,
                c,
                UNEXPECTED_BLOCK_END,
                f"second else() for if() opened at line {top.line}",
                "end",
            )
        else:
            top.has_else = True

    def exception(self, n: int, c: int) -> None:
        top = self.stack[-1] if self.stack else None
        if top is not None and top.kind == "try":
            top.kind = "exc"
            return
        if top is not None and any(f.kind == "try" for f in self.stack):
            # A block inside the try body was left open: report it, then recover.
            self.report(
                n,
                c,
                UNEXPECTED_BLOCK_END,
                f"exception() while {_BLOCK_LABEL[top.kind]} opened at line {top.line} "
                "is still open — "
                f"close it with {_BLOCK_CLOSER[top.kind]} first",
                _BLOCK_CLOSER[top.kind],
            )
            while self.stack[-1].kind != "try":
                self.stack.pop()
            self.stack[-1].kind = "exc"
            return
        self.report(n, c, UNEXPECTED_BLOCK_END, "exception() without a matching try()", "try")

    def finish(self) -> None:
        for frame in self.stack:
            if frame.closed_by_mismatch or (frame.kind == "exc" and not self.strict):
                continue
            self.report(
                frame.line,
                frame.column,
                UNCLOSED_BLOCK,
                f"{_BLOCK_LABEL[frame.kind]} opened here is never closed — "
                f"add {_BLOCK_CLOSER[frame.kind]}",
                _BLOCK_CLOSER[frame.kind],
            )
        for n, c, name, nargs, probe in self.pending:
            arity = self.functions.get(name)
            if arity is not None:
                if nargs >= 0 and nargs != arity:
                    self.report(
                        n,
                        c,
                        ARG_COUNT,
                        f"function '{name}' expects {arity} argument(s) but got {nargs}",
                    )
                continue
            sugg = suggest_command(name)
            if probe and not sugg:
                self.report(
                    n,
                    c,
                    TOLERATED_UNKNOWN_COMMAND,
                    f"unknown command '{name}()' tolerated inside try(): a deliberate "
                    "runtime-error probe that the exception handler catches",
                )
            else:
                self.report(n, c, UNKNOWN_COMMAND, _unknown_message(name), sugg)


def validate(code: str, *, strict: bool = False) -> ParseResult:
    """Validate an AVAP program. `valid` is False iff the trace holds an error."""
    return _Parser(strict).run(code)
