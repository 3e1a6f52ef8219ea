"""Other languages' constructs in an AVAP line: the catalogue the parser reports as
FOREIGN_SYNTAX, each with the language it comes from, a hint and the AVAP replacement.

Three kinds: constructs told by the line's first word (`FOREIGN_BY_KEYWORD`), constructs
anywhere in a line (`foreign_in`: `;`, `:=`, `=>`, f-strings, ...), and dotted calls whose
module names the language (`dotted_call`: `console.log`, `json.dumps`).
"""

from __future__ import annotations

import re

_COMPOUND = re.compile(r"[^\W\d][\w.\[\]]*\s*(?:[-+*/%]=|\+\+|--)")
_FSTRING = re.compile(r"(?<![\w$])[fF][rR]?[\"']")
_NEW_OBJECT = re.compile(r"\bnew\s+[A-Z]")

# Keyword-led foreign constructs, checked only when the line's first word is a key here
# (so ordinary command lines pay a single dict lookup). Each entry: regex on the stripped
# line, language, hint, AVAP replacement.
_LOOP_HINT = "AVAP loop syntax required: startLoop(var, from, to) ... endLoop()"
RESULT_HINT = "AVAP returns values with addResult(var)"
ForeignRule = tuple[re.Pattern[str], str, str, str]
# A construct found in a line: (column offset, language, hint, AVAP replacement).
Foreign = tuple[int, str, str, str]


def _rules(*rules: tuple[str, str, str, str]) -> list[ForeignRule]:
    return [(re.compile(p), lang, hint, sugg) for p, lang, hint, sugg in rules]


FOREIGN_BY_KEYWORD: dict[str, list[ForeignRule]] = {
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
    "print": _rules((r"print\s*[(\"']", "Python", RESULT_HINT, "addResult")),
    "println": _rules((r"println\s*\(", "Go/Java", RESULT_HINT, "addResult")),
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
    "console": _rules((r"console\.\w+", "JavaScript", RESULT_HINT, "addResult")),
    "fmt": _rules((r"fmt\.\w+", "Go", RESULT_HINT, "addResult")),
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


def foreign_in(code: str) -> Foreign | None:
    """A foreign construct anywhere in a line, detected on `code` (the line with its string
    contents masked), or None."""
    if code.endswith(";"):
        return len(code) - 1, "JavaScript/Go", "AVAP lines have no ';' terminator", ""
    if code.endswith(":"):
        return 0, "Python", "AVAP blocks are if(...)/startLoop(...)/try() closed by end()", ""
    if ":=" in code:
        return (
            code.index(":="),
            "Go",
            "assign with addVar(name, value) or x = command(...)",
            "addVar",
        )
    if "=>" in code:
        return code.index("=>"), "JavaScript", "AVAP has no arrow functions", ""
    if "===" in code or "!==" in code:
        return 0, "JavaScript", "compare inside if(variable, value, comparator)", "if"
    if _COMPOUND.match(code):
        return 0, "Python/JavaScript/Go", "update variables with addVar(name, value)", "addVar"
    if ('f"' in code or "f'" in code or 'F"' in code) and _FSTRING.search(code):
        return 0, "Python", "build strings with backtick templates `text ${var}`", ""
    if "new " in code and _NEW_OBJECT.search(code):
        return 0, "JavaScript", "AVAP has no objects; use the built-in commands", ""
    return None


def dotted_call(name: str) -> tuple[str, str, str]:
    """(language, hint, AVAP replacement) for a call of the dotted `name` (`fmt.Println`):
    AVAP has no modules or methods."""
    lang = _DOTTED_LANG.get(name.split(".", 1)[0], "Python/JavaScript")
    hint = (
        RESULT_HINT
        if name in ("console.log", "fmt.Println", "fmt.Printf")
        else ("AVAP has no modules or methods; use the built-in commands")
    )
    sugg = "addResult" if hint is RESULT_HINT else ""
    return lang, hint, sugg
