"""`eval_intents` on a small stratified CLINC150 subset (bounded: < ~60 s here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from offline.classifier.intents_eval import eval_intents
from offline.classifier.labelled import load_labelled
from shared.encoders.embeddings import DEFAULT_MODEL as MINILM
from tests.helpers import intent_datasets as ds

pytestmark = pytest.mark.skipif(not ds.available(), reason="shared intent datasets missing")


def test_helper_writes_csv_and_jsonl_outside_the_repo(tmp_path: Path) -> None:
    csv_train, csv_test = ds.clinc150_files(tmp_path / "c", intents=5, per_intent=10, oos_max=7)
    jl_train, _ = ds.clinc150_files(tmp_path / "j", fmt="jsonl", intents=5, per_intent=10,
                                   oos_max=7)
    assert csv_train.read_text().startswith("text,category\n")
    rows = load_labelled(csv_train)
    assert rows == load_labelled(jl_train)
    assert len(rows) == 5 * 10 + 7
    assert len({lab for _, lab in rows}) == 6
    assert sum(lab == "oos" for _, lab in load_labelled(csv_test)) == 7
    hwu_train, hwu_test = ds.hwu64_files(tmp_path / "h", fmt="jsonl")
    assert len(load_labelled(hwu_train)) == 8954
    assert len(load_labelled(hwu_test)) == 1076


@pytest.mark.timeout(180)
def test_eval_intents_clinc_subset(tmp_path: Path) -> None:
    train, test = ds.clinc150_files(tmp_path, intents=20, per_intent=30, oos_max=100, seed=1)
    r = eval_intents(train, test, threshold=0.85, calibration_folds=3, encoders=(MINILM,),
                     tune_epochs=0)
    assert r["threshold"] == 0.85
    assert r["threshold_from"] == "given"
    assert r["n_train"] == 20 * 30 + 100
    assert r["n_test"] == 20 * 30 + 100
    # chance is 1/21; a frozen MiniLM head scores far above it
    assert r["accuracy"] > 0.8
    assert r["macro_f1"] > 0.8
    assert r["in_scope_accuracy"] > 0.8
    assert r["oos_recall"] > 0.4
    assert r["train_seconds"] > 0
    assert set(r["sweep"]) >= {"0.0", "0.85"}


def test_eval_intents_closed_set_has_no_oos_keys(tmp_path: Path) -> None:
    train, test = ds.clinc150_files(tmp_path, intents=6, per_intent=20, include_oos=False)
    r = eval_intents(train, test, calibration_folds=2, encoders=(MINILM,), tune_epochs=0)
    assert r["threshold_from"] == "clarity"  # no oos lines to choose it on
    assert "oos_recall" not in r
    assert "in_scope_accuracy" not in r
    assert r["accuracy"] > 0.8


@pytest.mark.timeout(300)
def test_eval_intents_chooses_everything_on_train_lines_only(tmp_path: Path) -> None:
    """With `oos` lines in the train file and no threshold given, out of scope is the
    argmax at the 10% prior; the mixtures' weights come from the train split's folds,
    the fine-tuned member's from its first fold: the same whatever the test file."""
    train, test = ds.clinc150_files(tmp_path / "a", intents=10, per_intent=20, oos_max=40,
                                    seed=2)
    _, other_test = ds.clinc150_files(tmp_path / "b", intents=10, per_intent=20, oos_max=5,
                                      seed=2, test_split="val")
    a = eval_intents(train, test, calibration_folds=3, encoders=(MINILM,), tune_epochs=1)
    b = eval_intents(train, other_test, calibration_folds=3, encoders=(MINILM,),
                     tune_epochs=1)
    assert (a["threshold_from"], a["threshold"]) == ("oos-prior", 0.0)
    assert a["in_scope_accuracy"] > 0.8
    assert a["oos_recall"] > 0.4
    # The head mixed with the TF-IDF and kNN members, weights chosen on train lines too.
    assert a["mixture"] == b["mixture"]
    assert set(a["mixture"]["weights"]) == {"head", "tfidf", "knn"}
    assert sum(a["mixture"]["weights"].values()) == pytest.approx(1.0)
    assert a["cv_accuracy"] >= a["mixture"]["member_cv_accuracy"]["head"]
    # Then with the fine-tuned MiniLM, trained on two folds of three, weighed on the third.
    tuned = a["tuned"]
    assert tuned["fold_lines"] == (10 * 20 + 40) // 3
    assert tuned["finetune"]["examples_seen"] == 10 * 20 + 40 - tuned["fold_lines"]
    assert set(tuned["weights"]) == {"frozen", "tuned"}
    assert sum(tuned["weights"].values()) == pytest.approx(1.0)
    assert tuned["weights"] == b["tuned"]["weights"]
    assert tuned["fold_accuracy"] >= max(tuned["tuned_fold_accuracy"], 0.8)
