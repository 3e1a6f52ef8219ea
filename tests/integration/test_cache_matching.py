"""The answer cache's live matching decision on the written pair sets with the
classifier's own vectors (issue 33): every hard negative misses, paraphrases hit."""

from __future__ import annotations

from pathlib import Path

import pytest

from offline.classifier.cache_eval import evaluate, load_pairs

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from services.classifier.adapters import build_classifier
    from services.classifier.settings import ClassifierSettings

    heads = tmp_path_factory.mktemp("heads")
    classifier = build_classifier(ClassifierSettings.from_env({"CLASSIFIER_HEADS_DIR": str(heads)}))
    assert classifier is not None
    return classifier.first_encoder


@pytest.mark.parametrize("name", ["cache_pairs.jsonl", "cache_pairs_heldout.jsonl"])
def test_every_hard_negative_misses_and_paraphrases_hit(encoder, name: str) -> None:
    report, predictions = evaluate(load_pairs(DATA / name), encoder,
                                   layers=getattr(encoder, "layers", None))
    false_hits = [p["id"] for p in predictions if p["hit"] and not p["same"]]
    assert false_hits == []
    assert report["false_hit_rate"] == 0.0
    assert report["hit_rate"] >= 0.6
    for lang in ("en", "es"):
        assert report["by_lang"][lang]["hit_rate"] >= 0.5
    assert all(kind.get("false_hit_rate", 0.0) == 0.0 for kind in report["by_kind"].values())


def test_the_eval_command_prints_the_figures_and_the_predictions(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from intentroute.cli import app

    out = tmp_path / "predictions.jsonl"
    result = CliRunner().invoke(app, ["eval", "cache", str(DATA / "cache_pairs.jsonl"),
                                      "--json", "--predictions", str(out)],
                                env={"CLASSIFIER_HEADS_DIR": str(tmp_path / "heads")})
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"hit_rate", "false_hit_rate", "by_kind", "by_lang"} <= set(report)
    lines = out.read_text().splitlines()
    assert len(lines) == report["pairs"]
    assert {"id", "hit", "similarity", "reason"} <= set(json.loads(lines[0]))
