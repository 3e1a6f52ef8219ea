"""Layer 2 head, registry and micro-batcher with a fake deterministic encoder (no model:
testkit's HashedEncoder)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from offline.classifier.calibration import expected_calibration_error
from offline.classifier.labelled import load_labelled, stratified_split
from offline.classifier.promote import HeadWriter, train_and_promote
from offline.classifier.train import train_head
from services.classifier.layer2.batcher import MicroBatcher
from services.classifier.layer2.classifier import Layer2Classifier
from services.classifier.layer2.head import EmbeddingHead
from services.classifier.layer2.predict import Prediction
from shared.contracts.routing import Clarity
from shared.policy.clarity import clarity
from testkit.fakes import HashedEncoder

DIM = HashedEncoder.DIM
TOPICS = {
    "RETRIEVAL": ["docs", "explain", "what", "meaning", "reference"],
    "CODE_GENERATION": ["write", "function", "code", "implement", "script"],
    "CONVERSATIONAL": ["hello", "thanks", "bye", "hi", "cheers"],
    "PLATFORM": ["account", "billing", "quota", "usage", "invoice"],
}


def synthetic(n_per: int = 30, seed: int = 0, noise_words: int = 2) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(seed)
    filler = ["the", "a", "please", "now", "my", "it", "for", "me"]
    texts, labels = [], []
    for label, words in TOPICS.items():
        for _ in range(n_per):
            ws = list(rng.choice(words, size=2)) + list(rng.choice(filler, size=noise_words))
            rng.shuffle(ws)
            texts.append(" ".join(ws))
            labels.append(label)
    return texts, labels


@pytest.fixture(scope="module")
def enc() -> HashedEncoder:
    return HashedEncoder()


@pytest.fixture(scope="module")
def head(enc: HashedEncoder) -> EmbeddingHead:
    texts, labels = synthetic()
    return train_head(texts, labels, enc, seed=0, lexical=None)


def test_probabilities_sum_to_one_and_confident_on_clear_cases(
    head: EmbeddingHead, enc: HashedEncoder
) -> None:
    assert head.labels == sorted(TOPICS)
    probs = head.predict_proba(enc.encode(["write function code", "hello thanks bye", "x y"]))
    assert probs.shape == (3, 4)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-6)
    assert head.labels[int(probs[0].argmax())] == "CODE_GENERATION"
    assert head.labels[int(probs[1].argmax())] == "CONVERSATIONAL"
    assert probs[0].max() > 0.85
    assert probs[1].max() > 0.85
    # calibration metadata is recorded
    m = head.metrics
    assert m["cv_accuracy"] > 0.9
    assert 0 < m["temperature"] < 50
    assert 0.0 <= m["ece_calibrated"] <= 0.2
    assert len(m["data_hash"]) == 64


def test_save_load_round_trip_identical(head: EmbeddingHead, enc: HashedEncoder,
                                        tmp_path: Path) -> None:
    head.save(tmp_path / "h")
    assert sorted(p.name for p in (tmp_path / "h").iterdir()) == [
        "coef.npy", "head.json", "intercept.npy", "metrics.json"]
    again = EmbeddingHead.load(tmp_path / "h")
    x = enc.encode(["docs meaning", "billing quota please", "random words"])
    np.testing.assert_array_equal(head.predict_proba(x), again.predict_proba(x))
    assert again.labels == head.labels
    assert again.temperature == head.temperature
    assert not again.has_own_encoder


def test_ece_and_clarity_helpers() -> None:
    probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.6, 0.4]])
    assert expected_calibration_error(probs, np.array([0, 0, 1])) > 0
    assert clarity(0.9) is Clarity.CLEAR
    assert clarity(0.7) is Clarity.NEEDS_CONFIRMATION
    assert clarity(0.5) is Clarity.NEEDS_CLARIFICATION


def test_classifier_prediction_shape(head: EmbeddingHead, enc: HashedEncoder) -> None:
    clf = Layer2Classifier(head, enc)
    p = clf.classify("implement a script for me")
    assert isinstance(p, Prediction)
    assert p.label == "CODE_GENERATION"
    assert p.confidence == max(p.probabilities.values())
    assert [a for a, _ in p.alternatives]
    assert p.label not in dict(p.alternatives)
    assert [c for _, c in p.alternatives] == sorted((c for _, c in p.alternatives), reverse=True)
    assert abs(sum(p.probabilities.values()) - 1) < 1e-6
    batch = clf.classify_batch(["hello hi", "invoice usage", "docs explain"])
    assert [b.label for b in batch] == ["CONVERSATIONAL", "PLATFORM", "RETRIEVAL"]
    assert clf.classify_batch([]) == []


def test_registry_promotion_refuse_accept_and_reload(enc: HashedEncoder, tmp_path: Path) -> None:
    texts, labels = synthetic(seed=1)
    ev_texts, ev_labels = synthetic(n_per=15, seed=2)
    reg = HeadWriter(tmp_path / "heads", encoder=enc)
    assert reg.current() is None
    assert reg.current_version is None

    # First head: a mediocre one (few lines) is promoted because there is none.
    weak = train_head(texts[::6], labels[::6], enc, seed=0, lexical=None)
    r1 = reg.propose(weak, ev_texts, ev_labels)
    assert r1.promoted
    assert r1.version == "v0001"
    assert r1.current is None
    assert reg.current_version == "v0001"
    assert (tmp_path / "heads" / "v0001" / "metrics.json").exists()
    assert "data_hash" in json.loads((tmp_path / "heads" / "v0001" / "metrics.json").read_text())

    worker = Layer2Classifier.from_registry(tmp_path / "heads", encoder=enc)
    assert worker.version == "v0001"
    assert worker.maybe_reload() is False  # nothing new

    # Worse: shuffled labels.
    shuffled = list(np.random.default_rng(0).permutation(labels))
    bad = train_head(texts, shuffled, enc, seed=0, lexical=None)
    r2 = reg.propose(bad, ev_texts, ev_labels)
    assert not r2.promoted
    assert r2.current is not None
    assert r2.candidate["macro_f1"] < r2.current["macro_f1"]
    assert reg.current_version == "v0001"
    assert (tmp_path / "heads" / "rejected.jsonl").exists()
    assert worker.maybe_reload() is False

    # Better: all lines.
    good = train_head(texts, labels, enc, seed=0, lexical=None)
    r3 = reg.propose(good, ev_texts, ev_labels)
    assert r3.promoted, r3.reason
    assert r3.candidate["accuracy"] >= r3.current["accuracy"]  # type: ignore[index]
    assert r3.version == "v0002"
    assert r3.previous_version == "v0001"
    assert reg.versions() == ["v0001", "v0002"]

    # A running worker picks it up without a restart.
    assert worker.maybe_reload() is True
    assert worker.version == "v0002"
    assert worker.classify("write code").head_version == "v0002"
    assert worker.maybe_reload() is False


def test_pointer_is_written_atomically(enc: HashedEncoder, tmp_path: Path) -> None:
    reg = HeadWriter(tmp_path, encoder=enc)
    texts, labels = synthetic(n_per=10)
    v = reg.add(train_head(texts, labels, enc, lexical=None))
    reg.set_current(v)
    assert (tmp_path / "CURRENT").read_text().strip() == v
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    with pytest.raises(FileNotFoundError):
        reg.set_current("v9999")


def test_loaders_and_train_and_promote(enc: HashedEncoder, tmp_path: Path) -> None:
    texts, labels = synthetic(n_per=20)
    jl = tmp_path / "a.jsonl"
    jl.write_text("".join(
        json.dumps({"text": t, "label": lab, "lang": "en"}) + "\n"
        for t, lab in zip(texts[:40], labels[:40], strict=True)))
    hist = tmp_path / "history.jsonl"
    hist.write_text("".join(
        json.dumps({"topic": t, "type": lab}) + "\n"
        for t, lab in zip(texts[40:60], labels[40:60], strict=True)))
    csv_path = tmp_path / "b.csv"
    csv_path.write_text("text,category\n" + "".join(
        f'"{t}",{lab}\n' for t, lab in zip(texts[60:], labels[60:], strict=True)))
    rows = load_labelled([jl, hist, csv_path])
    assert len(rows) == len(texts)
    assert rows[0] == (texts[0], labels[0])
    assert rows[-1] == (texts[-1], labels[-1])
    _, ev = stratified_split(rows, 0.2, seed=0)
    assert len(ev) == 16
    assert {lab for _, lab in ev} == set(TOPICS)

    reg = HeadWriter(tmp_path / "heads", encoder=enc)
    res = train_and_promote([jl, hist, csv_path], reg, enc, holdout=0.2, seed=0,
                            lexical=None)
    assert res.promoted
    assert reg.current_version == "v0001"
    assert res.n_eval > 0
    head = reg.current()
    assert head is not None
    assert head.meta["n_eval"] == res.n_eval


async def test_micro_batcher_batches_concurrent_submissions(head: EmbeddingHead) -> None:
    enc = HashedEncoder(delay=0.005)
    clf = Layer2Classifier(head, enc)
    batcher = MicroBatcher(clf, max_batch=16, max_wait_ms=5)
    queries = [
        ("write function code", "CODE_GENERATION"),
        ("hello thanks", "CONVERSATIONAL"),
        ("billing invoice", "PLATFORM"),
        ("docs reference", "RETRIEVAL"),
    ] * 10
    results = await asyncio.gather(*(batcher.submit(q) for q, _ in queries))
    assert [r.label for r in results] == [lab for _, lab in queries]  # each its own result
    assert max(enc.batches) > 1
    assert max(enc.batches) <= 16
    assert sum(enc.batches) == len(queries)
    assert batcher.batches < len(queries)
    # The encoder ran in one worker thread, never on the event loop's thread.
    assert len(enc.threads) == 1
    assert threading.get_ident() not in enc.threads
    await batcher.close()
    with pytest.raises(RuntimeError):
        await batcher.submit("late")


async def test_micro_batcher_reload_runs_off_loop(enc: HashedEncoder, tmp_path: Path) -> None:
    texts, labels = synthetic(n_per=10)
    reg = HeadWriter(tmp_path, encoder=enc)
    reg.propose(train_head(texts[::3], labels[::3], enc, lexical=None), texts, labels)
    clf = Layer2Classifier.from_registry(tmp_path, encoder=enc)
    batcher = MicroBatcher(clf)
    assert await batcher.maybe_reload() is False
    res = reg.propose(train_head(texts, labels, enc, lexical=None), texts, labels)
    assert res.promoted
    assert await batcher.maybe_reload() is True
    assert (await batcher.submit("hello")).head_version == "v0002"
    await batcher.close()


async def test_micro_batcher_close_drains(head: EmbeddingHead) -> None:
    enc = HashedEncoder(delay=0.01)
    batcher = MicroBatcher(Layer2Classifier(head, enc), max_batch=4, max_wait_ms=1)
    tasks = [asyncio.create_task(batcher.submit(f"hello {i}")) for i in range(10)]
    await asyncio.sleep(0)  # submissions enqueued
    await batcher.close()
    done = [t.result() for t in tasks]
    assert len(done) == 10
    assert all(d.label == "CONVERSATIONAL" for d in done)


async def test_micro_batcher_propagates_errors(head: EmbeddingHead) -> None:
    class Boom(HashedEncoder):
        def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
            raise RuntimeError("encoder down")

    batcher = MicroBatcher(Layer2Classifier(head, Boom()))
    with pytest.raises(RuntimeError, match="encoder down"):
        await batcher.submit("hi")
    await batcher.close()


def test_lexical_block_reads_the_text_and_survives_save_and_load(
    enc: HashedEncoder, tmp_path: Path
) -> None:
    # Spanish wording the (fake) encoder cannot see: only the char n-grams carry it.
    texts = ["¿cuánto he gastado este mes?", "¿cuántas llamadas llevo?", "mi factura de marzo",
             "¿qué hace addVar?", "¿qué significa startLoop?", "explícame getDateTime"] * 4
    labels = ["PLATFORM"] * 3 + ["RETRIEVAL"] * 3
    labels = labels * 4
    blind = np.zeros((len(texts), DIM), dtype=np.float32)
    lex = {"analyzer": "char_wb", "ngram_range": [2, 4], "n_features": 2**12, "weight": 2.0}
    head = train_head(texts, labels, None, vectors=blind, lexical=lex, calibration_folds=2)
    x = np.zeros((2, DIM), dtype=np.float32)
    asked = ["¿cuánto llevo gastado?", "¿qué hace getDateTime?"]
    probs = head.predict_proba(x, asked)
    assert [head.labels[int(i)] for i in probs.argmax(axis=1)] == ["PLATFORM", "RETRIEVAL"]
    assert head.dim == DIM
    with pytest.raises(ValueError, match="reads the text"):
        head.predict_proba(x)
    again = EmbeddingHead.load(head.save(tmp_path / "lex"))
    assert again.lexical is not None
    assert again.lexical.settings == lex
    np.testing.assert_array_equal(again.predict_proba(x, asked), probs)


class ShallowEncoder(HashedEncoder):
    """The early exit's encoder: it only knows the CONVERSATIONAL and PLATFORM words
    (others hash to nothing), so its head is sure of those and unsure of the rest."""

    model_name = "fake-bow-shallow"
    KNOWN: ClassVar[set[str]] = set(TOPICS["CONVERSATIONAL"] + TOPICS["PLATFORM"])

    def vector(self, text: str) -> np.ndarray:
        return super().vector(" ".join(w for w in text.split() if w in self.KNOWN))


@pytest.fixture(scope="module")
def early_head(head: EmbeddingHead, tmp_path_factory: pytest.TempPathFactory) -> EmbeddingHead:
    texts, labels = synthetic(seed=3)
    shallow = train_head(texts, labels, ShallowEncoder(), seed=0, lexical=None)
    shallow.layers = 3
    full = EmbeddingHead.load(head.save(tmp_path_factory.mktemp("early") / "full"))
    full.early = shallow
    return full


def test_early_exit_decides_the_sure_texts_and_defers_the_rest(
    early_head: EmbeddingHead, head: EmbeddingHead
) -> None:
    full_enc, shallow_enc = HashedEncoder(), ShallowEncoder()
    clf = Layer2Classifier(early_head, full_enc, early_encoder=shallow_enc)
    texts = ["hello thanks bye", "write function code", "invoice usage quota", "x y"]
    preds = clf.classify_batch(texts)
    assert [p.early_exit for p in preds] == [True, False, True, False]
    assert shallow_enc.batches == [4]
    assert full_enc.batches == [2]
    assert preds[0].label == "CONVERSATIONAL"
    assert preds[2].label == "PLATFORM"
    assert preds[1].label == "CODE_GENERATION"
    assert preds[1].confidence > 0.85
    # The unsure ones carry the full head's answer, not the shallow head's guess.
    alone = Layer2Classifier(head, HashedEncoder())
    assert [p.probabilities for p in alone.classify_batch([texts[1], texts[3]])] == [
        preds[1].probabilities, preds[3].probabilities]
    # A threshold above every confidence sends everything to the full encoder.
    strict = Layer2Classifier(early_head, HashedEncoder(), early_encoder=ShallowEncoder(),
                              threshold=1.01)
    assert not any(p.early_exit for p in strict.classify_batch(texts))


def test_early_exit_head_survives_save_and_load(early_head: EmbeddingHead,
                                                tmp_path: Path) -> None:
    saved = early_head.save(tmp_path / "h")
    assert (saved / "early" / "head.json").exists()
    again = EmbeddingHead.load(saved)
    assert again.early is not None
    assert again.early.layers == 3
    assert again.layers is None
    assert json.loads((saved / "early" / "head.json").read_text())["encoder_layers"] == 3
    x = ShallowEncoder().encode(["hello thanks", "billing invoice"])
    np.testing.assert_array_equal(again.early.predict_proba(x),
                                  early_head.early.predict_proba(x))  # type: ignore[union-attr]
    assert EmbeddingHead.load(saved / "early").early is None
