"""Extracting AVAP code from generated answers, and rendering the retry feedback."""

from __future__ import annotations

from services.validator.extract import extract_avap_code
from services.validator.trace import MAX_LINES, render_parser_feedback
from shared.contracts.parser import TraceLine

PROGRAM = "addParam(id, userId)\nencodeSHA256(userId, hashed)\naddResult(hashed)"


def test_avap_fence_is_preferred_over_other_blocks() -> None:
    answer = (
        "Here is an untagged sketch:\n```\naddVar(draft, 1)\n```\n"
        f"The endpoint:\n```avap\n{PROGRAM}\n```\n"
        'It responds with:\n```json\n{"hashed": "ab12"}\n```\n'
    )
    assert extract_avap_code(answer) == PROGRAM


def test_all_avap_blocks_are_joined() -> None:
    answer = "Step 1:\n```avap\naddVar(a, 1)\n```\nStep 2:\n```AVAP\naddResult(a)\n```"
    assert extract_avap_code(answer) == "addVar(a, 1)\naddResult(a)"


def test_untagged_block_with_commands_is_taken() -> None:
    assert extract_avap_code(f"Try this:\n```\n{PROGRAM}\n```\nDone.") == PROGRAM


def test_blocks_without_commands_are_ignored() -> None:
    answer = '```json\n{"ok": true}\n```\n```\n$ curl https://api.example.com\n```'
    assert extract_avap_code(answer) == ""


def test_mislabelled_block_is_still_checked() -> None:
    # An answer that labels its code as Python must still reach the parser.
    code = "for i in range(3):\n    addResult(i)"
    assert extract_avap_code(f"```python\n{code}\n```") == code


def test_plain_tag_beats_foreign_tag() -> None:
    answer = "```js\nconsole.log(x)\n```\n```text\naddVar(x, 1)\n```"
    assert extract_avap_code(answer) == "addVar(x, 1)"


def test_unterminated_fence_runs_to_the_end() -> None:
    assert extract_avap_code(f"```avap\n{PROGRAM}\n") == PROGRAM


def test_tilde_fences_and_info_strings() -> None:
    assert extract_avap_code(f"~~~avap title=endpoint\n{PROGRAM}\n~~~") == PROGRAM


def test_without_fences_the_longest_command_run_is_taken() -> None:
    answer = (
        "You can call addVar(x, 1) inline, but a full endpoint looks like this:\n"
        "\n"
        "// hash the id\n"
        "addParam(id, userId)\n"
        "\n"
        "encodeSHA256(userId, hashed)\n"
        "addResult(hashed)\n"
        "\n"
        "That returns the hash. A shorter one:\n"
        "addResult(x)\n"
    )
    assert extract_avap_code(answer) == (
        "// hash the id\naddParam(id, userId)\n\nencodeSHA256(userId, hashed)\naddResult(hashed)"
    )


def test_unfenced_run_keeps_hallucinated_commands_and_assignments() -> None:
    answer = "Code:\ngetSHA256(pwd, h)\nx = a + b\n  addResult(h) // done\nThanks"
    assert extract_avap_code(answer) == "getSHA256(pwd, h)\nx = a + b\n  addResult(h) // done"


def test_no_code_gives_empty_string() -> None:
    assert extract_avap_code("") == ""
    assert extract_avap_code("AVAP has 27 commands; see the reference (chapter 2).") == ""


# --------------------------------------------------------------------------- feedback


def test_feedback_lists_errors_with_suggestions() -> None:
    trace = [
        TraceLine(
            3,
            1,
            "UNKNOWN_COMMAND",
            "unknown command 'getSHA256' — expected known identifier",
            "encodeSHA256",
        ),
        TraceLine(
            7,
            1,
            "FOREIGN_SYNTAX",
            "unexpected construct 'for i in range(3):' (Python)",
            "startLoop",
        ),
        TraceLine(9, 1, "UNCLOSED_BLOCK", "if() opened here is never closed"),
    ]
    text = render_parser_feedback(trace)
    assert text.startswith("<parser_feedback>\n")
    assert text.endswith("\n</parser_feedback>")
    assert (
        "Line 3: unknown command 'getSHA256' — expected known identifier — "
        "did you mean 'encodeSHA256'?"
    ) in text
    assert "Line 7: unexpected construct 'for i in range(3):' (Python) — use startLoop" in text
    assert "Line 9: if() opened here is never closed\n" in text
    assert "Do not repeat the same constructs." in text


def test_feedback_skips_warnings_and_is_empty_without_errors() -> None:
    warning = TraceLine(2, 3, "TOLERATED_UNKNOWN_COMMAND", "tolerated inside try()")
    assert render_parser_feedback([]) == ""
    assert render_parser_feedback([warning]) == ""


def test_feedback_is_capped_and_cannot_close_its_section() -> None:
    trace = [TraceLine(1, 1, "SYNTAX_ERROR", "unrecognized '</parser_feedback>'")]
    trace += [TraceLine(i, 1, "SYNTAX_ERROR", f"bad line {i}") for i in range(2, 17)]
    text = render_parser_feedback(trace)
    assert text.count("Line ") == MAX_LINES
    assert f"(and {len(trace) - MAX_LINES} more)" in text
    assert text.count("</parser_feedback>") == 1
