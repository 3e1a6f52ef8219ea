"""`intentroute eval multi` (issue 34) on small fixture files: its JSON keys, figures
that drop when a prediction is wrong, the per-part history, and strict input lines.
The cascade runs with its rules only (Layer 2 off), so no model is loaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from intentroute.cli import app
from offline.classifier import multi_eval
from offline.classifier.inputs import InputError
from offline.classifier.multi_eval import KEYS, evaluate_multi, load_multi
from services.classifier.cascade import Cascade
from services.classifier.split import Part, Split

R, C, V, P = "RETRIEVAL", "CODE_GENERATION", "CONVERSATIONAL", "PLATFORM"

# Rules-only routing: code requests, account questions and thanks are decided by
# Layer 1; anything else falls to the default (RETRIEVAL).
LINES: list[dict[str, Any]] = [
    {"id": "a", "lang": "en", "kind": "multi",
     "query": "what does addVar do? then write an endpoint that returns the time",
     "parts": [{"text": "what does addVar do?", "expected": R},
               {"text": "write an endpoint that returns the time", "expected": C}]},
    {"id": "b", "lang": "es", "kind": "multi",
     "query": "escribe un endpoint que devuelva la hora. Por cierto, ¿cuál es mi cuota?",
     "parts": [{"text": "escribe un endpoint que devuelva la hora.", "expected": C},
               {"text": "¿cuál es mi cuota?", "expected": P}]},
    {"id": "c", "lang": "en", "kind": "single",
     "query": "write an endpoint that reads a param, hashes it and returns it",
     "parts": [{"text": "write an endpoint that reads a param, hashes it and returns it",
                "expected": C}]},
    {"id": "d", "lang": "es", "kind": "single", "query": "compara addVar y addParam",
     "parts": [{"text": "compara addVar y addParam", "expected": R}],
     "history": [{"type": C, "topic": "an endpoint"}], "extra_context": None,
     "editor_context": None},
]


def write(tmp_path: Path, lines: list[dict[str, Any]], name: str = "set.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines),
                    encoding="utf-8")
    return path


async def run(tmp_path: Path, lines: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    return await evaluate_multi(load_multi(write(tmp_path, lines)), Cascade(), **kw)


async def test_the_report_has_every_figure_overall_and_by_language(tmp_path: Path) -> None:
    out = tmp_path / "pred.jsonl"
    report = await run(tmp_path, LINES, predictions_out=out)
    assert set(report["by_lang"]) == {"en", "es"}
    for key in (*KEYS, "gold_part_routing_accuracy", "split_precision", "split_recall"):
        best = 0.0 if key == "singles_wrongly_split" else 1.0
        assert report[key] == best, key
        assert all(report["by_lang"][lang][key] == best for lang in ("en", "es")), key
    assert (report["n"], report["n_multi"], report["n_single"]) == (4, 2, 2)
    assert report["wrong"] == []
    rows = [json.loads(raw) for raw in out.read_text(encoding="utf-8").splitlines()]
    assert [row["id"] for row in rows] == ["a", "b", "c", "d"]
    first = rows[0]["predicted"]
    assert [(p["text"], p["type"]) for p in first] == [("what does addVar do?", R), (
        "write an endpoint that returns the time", C)]
    query = LINES[0]["query"]
    assert all(query[p["start"]:p["end"]] == p["text"] for p in first)


async def test_a_wrong_type_lowers_exact_set_and_part_routing(tmp_path: Path) -> None:
    wrong = json.loads(json.dumps(LINES))
    wrong[0]["parts"][1]["expected"] = P  # the cascade says CODE_GENERATION
    report = await run(tmp_path, wrong)
    assert report["exact_set_accuracy"] == 0.75
    assert report["part_routing_accuracy"] == pytest.approx(5 / 6, abs=1e-4)
    assert report["split_accuracy"] == 1.0
    assert report["by_lang"]["es"]["exact_set_accuracy"] == 1.0
    assert report["by_lang"]["en"]["exact_set_accuracy"] == 0.5
    assert [w["id"] for w in report["wrong"]] == ["a"]


async def test_a_wrong_split_lowers_split_accuracy_and_counts_singles_cut(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def cut_in_two(message: str) -> Split:
        half = len(message) // 2
        return Split([Part(message[:half], 0, half), Part(message[half:], half,
                                                          len(message))])

    monkeypatch.setattr(multi_eval, "split", cut_in_two)
    report = await run(tmp_path, LINES)
    assert report["singles_wrongly_split"] == 1.0
    assert report["split_accuracy"] == 0.5
    assert report["split_precision"] == 0.5
    assert report["exact_set_accuracy"] < 1.0
    # Routing of the expected parts does not depend on the splitter.
    assert report["gold_part_routing_accuracy"] == 1.0
    # Each control's halves route to one type ("compara addV" / "ar y addParam" both
    # RETRIEVAL; "...hashes it and returns it" points back at the code): merged back,
    # neither is cut, and the multi-request lines are still scored on their types.
    assert report["same_type_merged"]["singles_wrongly_split"] == 0.0
    assert report["same_type_merged"]["exact_set_accuracy"] < 1.0


async def test_each_part_is_routed_with_the_parts_before_it_in_its_history(
        tmp_path: Path) -> None:
    seen: list[list[str]] = []

    class Recording(Cascade):
        async def decide(self, request: Any, history: Any, **kw: Any) -> Any:
            seen.append([h.topic for h in history])
            return await super().decide(request, history, **kw)

    line = {"id": "h", "lang": "es", "kind": "multi",
            "query": "¿qué hace startLoop? ¿y endLoop?",
            "parts": [{"text": "¿qué hace startLoop?", "expected": R},
                      {"text": "¿y endLoop?", "expected": R}],
            "history": [{"type": P, "topic": "mi cuota"}]}
    await evaluate_multi(load_multi(write(tmp_path, [line])), Recording())
    assert seen[0] == ["mi cuota"]
    assert seen[1] == ["mi cuota", "¿qué hace startLoop?"]


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"query": "q", "parts": [{"text": "q", "expected": R}], "lang": "en",
          "kind": "multi"}, "kind"),
        ({"query": "a b", "parts": [{"text": "a", "expected": R}, {"text": "b",
                                                                   "expected": C}],
          "lang": "en", "kind": "single"}, "kind"),
        ({"query": "q", "parts": [], "lang": "en", "kind": "single"}, "parts"),
        ({"query": "q", "parts": [{"text": "q", "expected": "NOPE"}], "lang": "en",
          "kind": "single"}, "parts[0].expected"),
        ({"query": "q", "parts": [{"text": "q", "expected": R}], "kind": "single"}, "lang"),
    ],
)
def test_a_malformed_line_names_file_line_and_field(tmp_path: Path, bad: dict[str, Any],
                                                    field: str) -> None:
    path = write(tmp_path, [LINES[2], bad])
    with pytest.raises(InputError) as caught:
        load_multi(path)
    assert (caught.value.line, caught.value.field) == (2, field)


def test_the_command_prints_the_figures_as_json(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLASSIFIER_HEADS_DIR", "")  # Layer 2 off: rules only
    monkeypatch.setenv("OLLAMA_HOST", "")
    monkeypatch.setenv("CLASSIFIER_LLM_MODEL", "")
    path, out = write(tmp_path, LINES), tmp_path / "pred.jsonl"
    done = CliRunner().invoke(app, ["eval", "multi", str(path), "--json",
                                    "--predictions", str(out)])
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    for key in KEYS:
        assert key in report, key
        assert key in report["by_lang"]["en"], key
    assert len(out.read_text(encoding="utf-8").splitlines()) == 4

    bad = write(tmp_path, [{"query": "q"}], "bad.jsonl")
    refused = CliRunner().invoke(app, ["eval", "multi", str(bad), "--json"])
    assert refused.exit_code == 2
    assert f"{bad}:1: parts:" in refused.stderr
    assert CliRunner().invoke(app, ["eval", "multi", "--json"]).exit_code == 2


def test_routing_sets_serve_as_single_request_controls(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLASSIFIER_HEADS_DIR", "")
    monkeypatch.setenv("OLLAMA_HOST", "")
    monkeypatch.setenv("CLASSIFIER_LLM_MODEL", "")
    routing = write(tmp_path, [
        {"id": "r1", "query": "write an endpoint that reads the id and returns it",
         "expected": C},
        {"id": "r2", "query": "What does addVar do? What does addParam do?",
         "expected": R}], "routing.jsonl")
    done = CliRunner().invoke(app, ["eval", "multi", "--controls", str(routing), "--json"])
    assert done.exit_code == 0, done.output
    (report,) = json.loads(done.stdout)["controls"].values()
    assert (report["n"], report["singles_wrongly_split"]) == (2, 0.5)
    assert [cut["id"] for cut in report["cut"]] == ["r2"]
    # Both halves of r2 are RETRIEVAL: answered as one part under that policy.
    assert report["same_type_merged_singles_wrongly_split"] == 0.0
