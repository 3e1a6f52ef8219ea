"""`eval intents`: train a Layer 2 head on one labelled file, score it on another.

Protocol
* Train on every line of `train_path` (for CLINC150 "full": in-scope + oos_train, the
  `oos` lines being one more class), with the `train_head` that trains the worker's
  heads (logistic regression + temperature scaling; optional encoder fine-tune), on
  the vectors of `INTENT_ENCODERS` side by side (see below) unless told otherwise.
* Without a fine-tune of the head's encoder, the head's calibrated probabilities are
  mixed (offline.mixture) with `ENSEMBLE_MEMBERS`, logistic regression on TF-IDF n-grams
  of the text and a cosine kNN over the same vectors, each fitted on the head's
  cross-validation folds at the weights that maximise the out-of-fold accuracy; then
  (`tune_epochs`, on by default) with a fine-tuned MiniLM's cosine classifier, trained
  on the lines outside the first fold, at the weight that maximises that fold's
  accuracy. A progress bar of the fine-tune's steps goes to stderr.
* Out of scope: when the train file has `oos_label` lines, they are one more class and
  the probabilities are shifted to the traffic `OOS_PRIOR` (10% out of scope) assumes
  (Bayes' rule, `prior_shift`) before the argmax: no threshold (`threshold` when given
  instead). Else a prediction below the clarity gate's `DECIDE_THRESHOLD` is out of
  scope. The test split chooses nothing.
* Open-set scoring applies when the test file has `oos_label` lines: a prediction
  whose confidence is below the threshold becomes `oos_label` (as does a predicted
  `oos` class). Then
  - in_scope_accuracy = share of in-scope test lines predicted exactly right,
  - oos_recall        = share of oos test lines predicted `oos`,
  - accuracy/macro_f1 over all test lines (oos counted as one class).
* Closed-set test files (no oos lines, e.g. HWU64): accuracy and macro-F1 of the
  argmax; the threshold only feeds the extra `coverage_at_threshold` /
  `accuracy_when_decided` figures (what Layer 2 would decide on its own).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from offline.classifier.calibration import expected_calibration_error
from offline.classifier.classification_metrics import macro_f1
from offline.classifier.labelled import load_labelled
from offline.classifier.mixture import (
    ENSEMBLE_MEMBERS,
    TUNE_EPOCHS,
    mix_frozen,
    mix_tuned,
    prior_shift,
)
from offline.classifier.train import train_head
from shared.encoders.embeddings import DEFAULT_MODEL, Encoder
from shared.policy.clarity import DECIDE_THRESHOLD

# The frozen encoders whose vectors the head reads, side by side. Train CV on CLINC150 /
# HWU64: MiniLM 0.972 / 0.900, mpnet 0.977 / 0.904, both 0.978 / 0.914 (docs/
# explanation/encoders.md; on the test splits 95.2 / 96.6 / 96.9% in-scope argmax,
# 90.9 / 90.8 / 92.3%).
INTENT_ENCODERS: tuple[str, ...] = (DEFAULT_MODEL, "all-mpnet-base-v2")

def _encode_cached(encoder: Encoder, texts: list[str], cache_dir: Path | None) -> np.ndarray:
    """Frozen-encoder vectors, cached as .npy keyed by encoder + texts (eval only)."""
    if cache_dir is None:
        return encoder.encode(texts, batch_size=64)
    h = hashlib.sha256(str(getattr(encoder, "model_name", type(encoder).__name__)).encode())
    for t in texts:
        h.update(t.encode())
        h.update(b"\x00")
    path = Path(cache_dir) / f"vec-{h.hexdigest()[:24]}.npy"
    if path.exists():
        return np.asarray(np.load(path))
    vecs = encoder.encode(texts, batch_size=64)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npy")
    np.save(tmp, vecs)
    os.replace(tmp, path)
    return vecs


def intent_encoder(models: Sequence[str], *, onnx_cache_dir: Path | None = None) -> Encoder:
    """The frozen encoder(s) `models` name (fast path, all cores, no cache); several
    side by side as one `ConcatEncoder`."""
    from shared.encoders.concat import ConcatEncoder
    from shared.encoders.fast import FastEncoder

    if not models:
        raise ValueError("name at least one encoder")
    members: list[Encoder] = [
        FastEncoder(m, threads=max(1, os.cpu_count() or 1), cache_size=0,
                    onnx_cache_dir=onnx_cache_dir) for m in models]
    return members[0] if len(members) == 1 else ConcatEncoder(members, list(models))


def eval_intents(
    train_path: Path,
    test_path: Path,
    *,
    threshold: float | None = None,
    oos_label: str = "oos",
    finetune_epochs: float = 0.0,
    seed: int = 0,
    encoder: Encoder | None = None,
    encoders: Sequence[str] = INTENT_ENCODERS,
    c: float = 20.0,
    calibration_folds: int = 5,
    finetune_options: dict[str, Any] | None = None,
    embed_cache: Path | None = None,
    onnx_cache_dir: Path | None = None,
    lexical: dict[str, Any] | None = None,
    members: Sequence[str] = ENSEMBLE_MEMBERS,
    tune_epochs: float = TUNE_EPOCHS,
    progress_bar: bool = True,
    sweep: tuple[float, ...] = (0.0, 0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9),
) -> dict[str, Any]:
    """Train on `train_path`, evaluate on `test_path`; see the module doc for the protocol.

    Returns accuracy, macro_f1, n_train, n_test, train_seconds (+ in_scope_accuracy,
    oos_recall when the test file has oos lines), the threshold and how it was chosen,
    and diagnostics (ECE, temperature, coverage, a threshold sweep). `encoder` (else
    `encoders` by name; a fine-tune starts from the first) gives the vectors;
    `lexical`: the head's char n-gram block (off: on HWU64 it took ~9x the training
    time for a lower train CV, 0.911 against 0.914). `members`: what the head is mixed
    with (() for the head alone; no mixture with a fine-tune); `tune_epochs`: the
    fine-tuned member's epochs (0: none), `progress_bar` its bar. `embed_cache`: a directory
    caching the frozen vectors between runs; `onnx_cache_dir`: where the encoders keep
    their exported graphs.
    """
    train_rows = load_labelled(train_path)
    test_rows = load_labelled(test_path)
    tr_texts, tr_labels = [t for t, _ in train_rows], [lab for _, lab in train_rows]
    te_texts, te_labels = [t for t, _ in test_rows], np.array([lab for _, lab in test_rows])

    if encoder is None:
        encoder = intent_encoder(encoders[:1] if finetune_epochs else encoders,
                                 onnx_cache_dir=onnx_cache_dir)

    started = time.perf_counter()
    vectors = None
    if not finetune_epochs:
        vectors = _encode_cached(encoder, tr_texts, embed_cache)
    heldout: dict[str, np.ndarray] = {}
    head = train_head(
        tr_texts,
        tr_labels,
        encoder,
        seed=seed,
        c=c,
        calibration_folds=calibration_folds,
        finetune_epochs=finetune_epochs,
        finetune_options=finetune_options,
        vectors=vectors,
        lexical=lexical,
        on_heldout=lambda p, y: heldout.update(probs=p, y=y),
    )
    train_seconds = time.perf_counter() - started

    if head.encoder_dir is not None:
        # The fine-tuned encoder's graph was exported into its directory by train_head.
        test_encoder = head.make_encoder(threads=max(1, os.cpu_count() or 1),
                                         onnx_cache_dir=head.encoder_dir / "onnx")
        test_vecs = test_encoder.encode(te_texts, batch_size=64)
        # The fine-tuned encoder (~90 MB + its ONNX graph) was a temporary dir: drop it.
        if head.encoder_dir.name.startswith("intentroute-ft-"):
            shutil.rmtree(head.encoder_dir, ignore_errors=True)
    else:
        test_vecs = _encode_cached(encoder, te_texts, embed_cache)
    probs = head.predict_proba(test_vecs, te_texts)
    mixture: dict[str, Any] | None = None
    tuned: dict[str, Any] | None = None
    if members and heldout and vectors is not None:
        started = time.perf_counter()
        mixture, heldout["probs"], probs = mix_frozen(
            members, heldout["probs"], probs, heldout["y"], tr_texts, te_texts, vectors,
            test_vecs, calibration_folds=calibration_folds, seed=seed)
        if tune_epochs:
            tuned, probs = mix_tuned(heldout["probs"], probs, heldout["y"], head.labels,
                                     tr_texts, te_texts, calibration_folds=calibration_folds,
                                     seed=seed, epochs=tune_epochs, progress_bar=progress_bar)
        train_seconds += time.perf_counter() - started
    calibrated = probs
    if threshold is None:  # no-op without oos lines in the train file
        probs = prior_shift(probs, head.labels, oos_label,
                            float(np.mean(np.asarray(tr_labels) == oos_label)))
    how = ("given" if threshold is not None else "oos-prior" if oos_label in head.labels
           else "clarity")
    threshold = (threshold if threshold is not None else 0.0 if how == "oos-prior"
                 else DECIDE_THRESHOLD)
    labels = np.array(head.labels)
    pred = labels[probs.argmax(axis=1)]
    conf = probs.max(axis=1)

    is_oos = te_labels == oos_label
    open_set = bool(is_oos.any())
    result: dict[str, Any] = {}

    def scores(th: float) -> dict[str, float]:
        final = np.where(conf < th, oos_label, pred) if open_set else pred
        out = {
            "accuracy": float((final == te_labels).mean()),
            "macro_f1": macro_f1(te_labels, final),
        }
        if open_set:
            out["in_scope_accuracy"] = float((final[~is_oos] == te_labels[~is_oos]).mean())
            out["oos_recall"] = float((final[is_oos] == oos_label).mean())
        return out

    result.update(scores(threshold))
    known = np.isin(te_labels, labels)
    y_idx = np.array([head.labels.index(lab) if lab in head.labels else -1 for lab in te_labels])
    decided = conf > threshold
    result.update(
        n_train=len(train_rows),
        n_test=len(test_rows),
        train_seconds=round(train_seconds, 1),
        threshold=threshold,
        threshold_from=how,
        encoder=str(getattr(encoder, "model_name", type(encoder).__name__)),
        finetune_epochs=finetune_epochs,
        argmax_accuracy=float((pred == te_labels).mean()),
        coverage_at_threshold=float(decided.mean()),
        accuracy_when_decided=float((pred[decided] == te_labels[decided]).mean())
        if decided.any()
        else 0.0,
        test_ece=expected_calibration_error(calibrated[known], y_idx[known])
        if known.any() else None,
        temperature=head.temperature,
        cv_accuracy=mixture["cv_accuracy"] if mixture else head.metrics.get("cv_accuracy"),
        mixture=mixture,
        tuned=tuned,
        cv_ece_calibrated=head.metrics.get("ece_calibrated"),
        finetune_seconds=head.metrics.get("finetune_seconds"),
    )
    if open_set:
        result["sweep"] = {
            str(th): {k: round(v, 4) for k, v in scores(th).items()} for th in sweep
        }
    return result
