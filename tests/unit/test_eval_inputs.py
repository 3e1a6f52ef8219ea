"""Evaluation inputs (issue 22, item 8): null optional fields are accepted; a malformed
line is one line naming file, line number and field, and the command exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from intentroute.cli import app
from offline.classifier.inputs import InputError
from offline.classifier.labelled import load_labelled
from offline.classifier.routing_eval import load_lines
from offline.classifier.rules_eval import load_paraphrases
from shared.contracts.routing import QueryType


def _write(tmp_path: Path, name: str, *lines: object) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n",
                    encoding="utf-8")
    return path


def test_routing_lines_accept_null_optional_fields(tmp_path: Path) -> None:
    path = _write(tmp_path, "r.jsonl",
                  {"query": "what is addVar", "expected": "RETRIEVAL", "history": None,
                   "extra_context": None, "editor_context": None, "query_type": None,
                   "id": None, "note": None},
                  {"query": "and that?", "expected": "CODE_GENERATION",
                   "history": [{"type": "CODE_GENERATION", "topic": None}]})
    first, second = load_lines(path)
    assert (first.query, first.expected, first.history) == ("what is addVar",
                                                           QueryType.RETRIEVAL, None)
    assert second.history is not None
    assert second.history[0].type == QueryType.CODE_GENERATION


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"query": "q", "expected": "SOMETHING"}, "expected"),
        ({"expected": "RETRIEVAL"}, "query"),
        ({"query": 3, "expected": "RETRIEVAL"}, "query"),
        ({"query": "q", "expected": "RETRIEVAL", "history": [{"type": "NOPE"}]},
         "history[0].type"),
        ('{"query": "q", "expected": ', "(line)"),
    ],
)
def test_a_malformed_routing_line_names_file_line_and_field(tmp_path: Path, bad: object,
                                                            field: str) -> None:
    path = _write(tmp_path, "r.jsonl", {"query": "ok", "expected": "RETRIEVAL"}, "", bad)
    with pytest.raises(InputError) as caught:
        load_lines(path)
    assert (caught.value.line, caught.value.field) == (3, field)
    assert str(caught.value).startswith(f"{path}:3: {field}: ")


def test_intent_lines_accept_null_extras_and_integer_labels(tmp_path: Path) -> None:
    path = _write(tmp_path, "i.jsonl", {"text": "card lost", "label": "lost_card",
                                        "lang": None},
                  {"text": "balance please", "label": 7, "split": None})
    assert load_labelled(path) == [("card lost", "lost_card"), ("balance please", "7")]


@pytest.mark.parametrize(
    ("bad", "field"),
    [({"text": None, "label": "x"}, "text"), ({"text": "t", "label": None}, "label"),
     ({"text": "t"}, "text/label"), ("[1, 2]", "(line)"), ("{oops", "(line)")],
)
def test_a_malformed_intent_line_names_file_line_and_field(tmp_path: Path, bad: object,
                                                           field: str) -> None:
    path = _write(tmp_path, "i.jsonl", {"text": "fine", "label": "a"}, bad)
    with pytest.raises(InputError) as caught:
        load_labelled(path)
    assert (caught.value.line, caught.value.field) == (2, field)
    assert str(caught.value).startswith(f"{path}:2: {field}: ")


def test_paraphrase_lines_accept_null_optional_fields(tmp_path: Path) -> None:
    path = _write(tmp_path, "p.jsonl",
                  {"query": "thanks", "expected": "CONVERSATIONAL", "family": "social",
                   "fires": True, "history": None, "trusted": None, "editor_context": None})
    (line,) = load_paraphrases(path)
    assert line.trusted is None
    assert line.family == "social"


@pytest.mark.parametrize(
    "command",
    [["eval", "routing"], ["eval", "rules"], ["eval", "intents", "--train"]],
)
def test_the_cli_reports_a_malformed_line_in_one_line_and_exits_2(
        tmp_path: Path, command: list[str]) -> None:
    if command[1] == "intents":
        path = _write(tmp_path, "i.jsonl", {"text": "fine", "label": "a"},
                      {"text": None, "label": "b"})
        args = [*command, str(path), "--test", str(path)]
        expected = f"{path}:2: text: "
    else:
        path = _write(tmp_path, "x.jsonl", {"query": "q", "expected": "NOT_A_TYPE",
                                            "family": "social", "fires": True})
        args = [*command, str(path)]
        expected = f"{path}:1: expected: "
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    err = result.stderr if result.stderr_bytes is not None else result.output
    assert err.startswith(expected)
    assert err.count("\n") == 1
    assert "Traceback" not in result.output


def test_a_missing_file_is_one_line_too(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["eval", "rules", str(tmp_path / "absent.jsonl")])
    assert result.exit_code == 2
    assert "absent.jsonl" in result.output
    assert result.output.count("\n") == 1


@pytest.mark.parametrize("flag", ["--tune-epochs", "--finetune-epochs"])
def test_negative_epochs_are_refused_in_one_line(tmp_path: Path, flag: str) -> None:
    path = _write(tmp_path, "i.jsonl", {"text": "fine", "label": "a"})
    result = CliRunner().invoke(app, ["eval", "intents", "--train", str(path), "--test",
                                      str(path), flag, "-1"])
    assert result.exit_code == 2
    assert flag in result.output
    assert result.output.count("\n") == 1
