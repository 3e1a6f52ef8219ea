"""The AVAP reference parser: valid programs, every trace code, suggestions, foreign syntax,
strict vs lenient, the AVAP Lite examples and the invalid-program set."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from services.parser.avap import ParseResult, suggest_command, validate
from services.parser.commands import COMMANDS
from shared.contracts.parser import TraceLine, is_error

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
AVAP_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "avap"


def _jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


VALID = _jsonl(DATA / "valid_avap.jsonl")
INVALID = _jsonl(DATA / "invalid_avap.jsonl")


def errors(result: ParseResult) -> list[TraceLine]:
    return [t for t in result.trace if is_error(t)]


def first_error(code: str, *, strict: bool = False) -> TraceLine:
    result = validate(code, strict=strict)
    assert not result.valid, f"expected invalid: {code!r}"
    return errors(result)[0]


# --------------------------------------------------------------------------- valid programs


@pytest.mark.parametrize("row", VALID, ids=[r["id"] for r in VALID])
@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
def test_valid_programs_have_an_empty_trace(row: dict[str, Any], strict: bool) -> None:
    result = validate(row["program"], strict=strict)
    assert result.valid
    assert result.trace == []


def test_valid_set_is_big_enough_and_has_the_benchmark_program() -> None:
    assert len(VALID) >= 15
    bench = next(r for r in VALID if r["id"] == "order_report_50")
    assert 45 <= len(bench["program"].splitlines()) <= 55


def test_empty_and_comment_only_programs_are_valid() -> None:
    assert validate("").valid
    assert validate("// nothing to do\n\n   // still nothing\n", strict=True).valid


def test_unicode_identifiers_crlf_and_bom() -> None:
    assert validate('\ufeffaddVar(año, "café")\r\naddResult(año)\r\n', strict=True).trace == []


def test_urls_in_arguments_are_not_comments_but_trailing_comments_are() -> None:
    code = "RequestGet(https://api.example.com/a, , , r) // fetch it\naddResult(r)"
    assert validate(code, strict=True).valid
    # The "//" after the call starts a comment, so its contents are not parsed.
    assert validate("addVar(x, 1) // print(x); for i in range(3):", strict=True).valid


def test_backtick_templates_regexes_and_formats_are_arguments() -> None:
    code = "\n".join(
        [
            "addVar(q, `SELECT * FROM t WHERE a = ${a} AND b = '${b}'`)",
            "getRegex(text, [a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+, email)",
            r"replace(raw, \(\d+\), _, clean)",
            "getDateTime(%Y-%m-%dT%H:%M:%S, 0, UTC, now)",
            'addVar(msg, "it\'s a \\"quoted\\" value, with commas")',
            "addVar(note, don't panic)",
        ]
    )
    assert validate(code, strict=True).trace == []


def test_parse_result_encodes_to_json() -> None:
    result = validate("getSHA256(a, b)")
    decoded = msgspec.json.decode(msgspec.json.encode(result), type=ParseResult)
    assert decoded == result


# --------------------------------------------------------------------------- trace codes

CODE_CASES = [
    ("UNKNOWN_COMMAND", "addVar(a, 1)\nfetchUser(a, user)", 2, 1),
    ("ARG_COUNT", "addVar(a, 1)\naddResult(a, b)", 2, 1),
    ("INVALID_ARGUMENT", "if(a, 1, equals)\nend()", 1, 1),
    ("UNCLOSED_BLOCK", "addVar(a, 1)\nstartLoop(i, 1, 3)\n  addResult(i)", 2, 1),
    ("UNEXPECTED_BLOCK_END", "addVar(a, 1)\nendLoop()", 2, 1),
    ("UNBALANCED_BRACKETS", "addVar(a, [1, 2)", 1, 16),
    ("UNTERMINATED_STRING", 'addVar(a, "open)', 1, 11),
    ("FOREIGN_SYNTAX", "addVar(a, 1)\nfor i in range(3):\n  addResult(i)", 2, 1),
    ("INVALID_ASSIGNMENT", "user.name = 1", 1, 1),
    ("SYNTAX_ERROR", "addVar(a, 1) addResult(a)", 1, 14),
]


@pytest.mark.parametrize(
    ("code", "program", "line", "column"), CODE_CASES, ids=[c[0] for c in CODE_CASES]
)
def test_each_trace_code(code: str, program: str, line: int, column: int) -> None:
    err = first_error(program)
    assert (err.code, err.line, err.column) == (code, line, column)
    assert err.message


def test_bracket_mismatch_names_the_opener() -> None:
    err = first_error("addVar(a, [1, 2)")
    assert "'[' opened at column 11" in err.message
    assert first_error("addVar(limit, 10").message == "'(' is never closed"


def test_columns_are_one_based_and_follow_indentation() -> None:
    err = first_error("try()\n    getSHA256(a, b)\nexception(e)\nend()")
    assert (err.line, err.column) == (2, 5)


def test_block_errors_point_at_the_opener_or_the_wrong_closer() -> None:
    unclosed = first_error("if(a, 1, =)\n  addResult(a)\nelse()\n  addVar(a, 2)")
    assert (unclosed.code, unclosed.line, unclosed.suggestion) == ("UNCLOSED_BLOCK", 1, "end()")

    wrong = validate("startLoop(i, 1, 3)\n  addResult(i)\nend()")
    assert [(t.code, t.line, t.suggestion) for t in wrong.trace] == [
        ("UNEXPECTED_BLOCK_END", 3, "endLoop()")
    ]
    # A missing end() inside a loop: one diagnostic, not a cascade.
    nested = validate("startLoop(i, 1, 3)\n  if(i, 2, =)\n    addResult(i)\nendLoop()")
    assert [(t.code, t.line) for t in nested.trace] == [("UNEXPECTED_BLOCK_END", 4)]
    assert "if() opened at line 2" in nested.trace[0].message


def test_else_and_exception_need_their_opener() -> None:
    assert first_error("addVar(a, 1)\nelse()\nend()").line == 2
    assert first_error("if(a, 1, =)\nelse()\nelse()\nend()").line == 3
    assert first_error("addVar(a, 1)\nexception(e)\nend()").line == 2


def test_strict_try_needs_an_exception_handler() -> None:
    err = first_error("try()\n  ormDirect(q, r)\nend()", strict=True)
    assert (err.code, err.line) == ("SYNTAX_ERROR", 3)
    assert validate("try()\n  ormDirect(q, r)\nend()").valid  # lenient


def test_arg_count_suggestion_is_the_signature() -> None:
    err = first_error("if(age >= 18)\n  addResult(age)\nend()")
    assert err.code == "ARG_COUNT"
    assert err.suggestion == "if(variable, variableValue, comparator)"
    assert "expects 3 arguments" in err.message
    assert "got 1" in err.message


def test_unknown_block_spelling_keeps_the_structure() -> None:
    result = validate("if(a, 1, =)\n  addResult(a)\nendIf()")
    assert [(t.code, t.line, t.suggestion) for t in result.trace] == [("UNKNOWN_COMMAND", 3, "end")]


# --------------------------------------------------------------------------- suggestions


@pytest.mark.parametrize(
    ("wrong", "right"),
    [("getSHA256", "encodeSHA256"), ("returnResult", "addResult"), ("readParam", "addParam")],
)
def test_near_miss_commands_get_a_suggestion(wrong: str, right: str) -> None:
    err = first_error(f"addVar(a, 1)\n{wrong}(a, b)")
    assert err.code == "UNKNOWN_COMMAND"
    assert err.suggestion == right
    assert f"'{wrong}'" in err.message
    assert suggest_command(wrong) == right


def test_suggestions_from_case_and_edit_distance() -> None:
    assert suggest_command("addvar") == "addVar"
    assert suggest_command("requestGet") == "RequestGet"
    assert suggest_command("getListLength") == "getListLen"
    assert suggest_command("addResults") == "addResult"
    assert suggest_command("comandoInexistente") == ""


# --------------------------------------------------------------------------- foreign syntax

FOREIGN = [
    ("python_for", "for i in range(10):\n    addResult(i)", "Python"),
    ("python_def", "def handler(req):\n    addResult(req)", "Python"),
    ("python_import", "import requests", "Python"),
    ("python_print", 'print("hello")', "Python"),
    ("python_elif", "if(a, 1, =)\nelif(a, 2, =)\nend()", "Python"),
    ("python_colon_block", "if a == 1:\n    addResult(a)", "Python"),
    ("python_fstring", 'addVar(msg, f"hi {name}")', "Python"),
    ("js_const", "const url = 'https://x'", "JavaScript"),
    ("js_let", "let n = 0", "JavaScript"),
    ("js_arrow", "addParam(vals, v)\nd = v.map(x => x * 2)", "JavaScript"),
    ("js_console", "console.log(total)", "JavaScript"),
    ("js_semicolon", "addVar(a, 1);", "JavaScript"),
    ("js_function", "function () {\n  addResult(a)\n}", "JavaScript"),
    ("js_if_brace", "if (a === 1) {\n  addResult(a)\n}", "JavaScript"),
    ("go_func", "func main() {\n  addVar(a, 1)\n}", "Go"),
    ("go_short_decl", "x := 5", "Go"),
    ("go_println", "fmt.Println(x)", "Go"),
    ("go_package", "package main", "Go"),
]


@pytest.mark.parametrize(("name", "program", "lang"), FOREIGN, ids=[f[0] for f in FOREIGN])
@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
def test_foreign_syntax_is_named(name: str, program: str, lang: str, strict: bool) -> None:
    err = first_error(program, strict=strict)
    assert err.code == "FOREIGN_SYNTAX", err
    assert lang in err.message
    assert "unexpected construct" in err.message


def test_python_loop_message_points_to_startloop() -> None:
    err = first_error("for i in range(1, 4):\n    addResult(i)")
    assert err.suggestion == "startLoop"
    assert "startLoop(var, from, to) ... endLoop()" in err.message


# --------------------------------------------------------------------------- strict vs lenient

LENIENT_ONLY = [
    ("expression_assignment", 'addVar(i, 1)\nticket = "T-" + str(i)\naddResult(ticket)'),
    ("status_assignment", "_status = 404"),
    ("quoted_names", "addVar('total', 5)\naddResult(\"total\")"),
    ("quoted_comparator", 'if(a, 1, "!=")\n  addResult(a)\nend()'),
    ("exception_without_arg_or_end", "try()\n  ormDirect(q, r)\nexception()\n_status = 500"),
    ("assigned_exception", "try()\n  ormDirect(q, r)\nerr = exception(msg)\naddResult(err)"),
    ("bare_end", "if(a, 1, =)\n  addResult(a)\nend"),
    ("hash_comment", "# a comment\naddVar(a, 1)"),
    ("function_block", "function twice(n) {\n  return n * 2\n}\nr = twice(4)\naddResult(r)"),
    (
        "handler_closed_by_loop_end",
        "startLoop(i, 1, 2)\n try()\n  ormDirect(q, r)\n exception(e)\n  addVar(r, 0)\nendLoop()",
    ),
]


@pytest.mark.parametrize(("name", "program"), LENIENT_ONLY, ids=[c[0] for c in LENIENT_ONLY])
def test_lite_dialect_is_lenient_only(name: str, program: str) -> None:
    assert validate(program, strict=False).valid, validate(program).trace
    assert not validate(program, strict=True).valid


def test_strict_explains_expression_assignments() -> None:
    err = first_error("a = 1 + 2", strict=True)
    assert err.code == "INVALID_ASSIGNMENT"
    assert err.suggestion == "addVar(a, ...)"


def test_strict_name_parameters_must_be_identifiers() -> None:
    err = first_error('addVar("total", 1)', strict=True)
    assert (err.code, err.suggestion) == ("INVALID_ARGUMENT", "total")


def test_lenient_unknown_commands_still_fail() -> None:
    err = first_error("addVar(a, 1)\ncomandoInexistente()")
    assert err.code == "UNKNOWN_COMMAND"
    # Inside a try, a hallucinated command that does something is still an error...
    assert first_error("try()\n  sendEmail(to, body)\nexception(e)\nend()").line == 2
    assert first_error("try()\n  getSHA256()\nexception(e)\nend()").suggestion == "encodeSHA256"
    # ...and a call to an undefined function too.
    assert first_error("r = twice(4)").code == "UNKNOWN_COMMAND"


def test_lenient_tolerates_a_bare_error_probe_inside_try_with_a_warning() -> None:
    program = "try()\n  comandoInexistente()\nexception(e)\nend()"
    result = validate(program)
    assert result.valid
    assert [(t.code, t.line) for t in result.trace] == [("TOLERATED_UNKNOWN_COMMAND", 2)]
    assert first_error(program, strict=True).code == "UNKNOWN_COMMAND"


def test_lenient_function_arity_and_return_placement() -> None:
    err = first_error("function add(a, b) {\n  return a + b\n}\nr = add(1)")
    assert (err.code, err.line) == ("ARG_COUNT", 4)
    assert first_error("return x").code == "FOREIGN_SYNTAX"
    assert first_error("function f(a) {\n  addResult(a)").code == "UNCLOSED_BLOCK"


# --------------------------------------------------------------------------- AVAP Lite examples


def _lite_examples() -> Iterator[Any]:
    path = AVAP_DATA / "examples_from_AVAP_Lite_oss_tests.jsonl"
    if not path.exists():
        yield pytest.param(None, marks=pytest.mark.skip(reason=f"{path} not available"))
        return
    for row in _jsonl(path):
        yield pytest.param(row, id=row["test"])


@pytest.mark.parametrize("row", list(_lite_examples()))
def test_every_lite_example_is_valid_in_lenient_mode(row: dict[str, Any]) -> None:
    result = validate(row["script"], strict=False)
    assert result.valid, result.trace


def test_command_table_matches_the_reference() -> None:
    path = AVAP_DATA / "commands-reference.json"
    if not path.exists():
        pytest.skip(f"{path} not available")
    reference = json.loads(path.read_text(encoding="utf-8"))["commands"]
    assert len(COMMANDS) == 27
    assert {c["name"]: [p["name"] for p in c["parameters"]] for c in reference} == {
        name: [p.name for p in cmd.params] for name, cmd in COMMANDS.items()
    }


# --------------------------------------------------------------------------- invalid set

KIND_CODES = {
    "hallucinated_command": {"UNKNOWN_COMMAND"},
    "arg_count": {"ARG_COUNT"},
    "python_syntax": {"FOREIGN_SYNTAX"},
    "js_syntax": {"FOREIGN_SYNTAX"},
    "go_syntax": {"FOREIGN_SYNTAX"},
    "missing_end": {"UNCLOSED_BLOCK", "UNEXPECTED_BLOCK_END"},
    "missing_endloop": {"UNCLOSED_BLOCK", "UNEXPECTED_BLOCK_END"},
    "wrong_block_end": {"UNEXPECTED_BLOCK_END"},
    "else_without_if": {"UNEXPECTED_BLOCK_END"},
    "unexpected_block_end": {"UNEXPECTED_BLOCK_END"},
    "unterminated_string": {"UNTERMINATED_STRING"},
    "unbalanced_brackets": {"UNBALANCED_BRACKETS"},
    "invalid_assignment": {"INVALID_ASSIGNMENT"},
    "invalid_argument": {"INVALID_ARGUMENT"},
    "syntax_error": {"SYNTAX_ERROR"},
}


def test_invalid_set_shape() -> None:
    assert len(INVALID) >= 45
    assert len({r["id"] for r in INVALID}) == len(INVALID)
    for row in INVALID:
        n = len(row["program"].splitlines())
        assert 3 <= n <= 15, row["id"]
        assert 1 <= row["error_line"] <= n, row["id"]
        assert row["kind"] in KIND_CODES, row["id"]


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
def test_invalid_set_every_program_flagged_on_the_right_line(strict: bool) -> None:
    results = [(row, validate(row["program"], strict=strict)) for row in INVALID]
    unflagged = [row["id"] for row, result in results if result.valid]
    assert unflagged == []
    right_line = [errors(result)[0].line == row["error_line"] for row, result in results]
    assert sum(right_line) / len(INVALID) >= 0.95
    right_code = [errors(result)[0].code in KIND_CODES[row["kind"]] for row, result in results]
    assert sum(right_code) / len(INVALID) >= 0.9


# --------------------------------------------------------------------------- speed


def test_fifty_line_program_parses_well_under_two_ms() -> None:
    program = next(r["program"] for r in VALID if r["id"] == "order_report_50")
    samples = []
    for _ in range(300):
        t0 = time.perf_counter()
        validate(program)
        samples.append(time.perf_counter() - t0)
    assert statistics.median(samples) < 0.002
