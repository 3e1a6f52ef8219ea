"""`eval intents`: train a Layer 2 head on one labelled file, score it on another.

Protocol
* Train on every line of `train_path` (for CLINC150 "full": in-scope + oos_train, the
  `oos` lines being one more class), with the `train_head` that trains the worker's
  heads (logistic regression + temperature scaling; optional encoder fine-tune).
* Open-set scoring applies when the test file has `oos_label` lines: a prediction
  whose calibrated confidence is below `threshold` becomes `oos_label` (as does a
  predicted `oos` class). Then
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
from pathlib import Path
from typing import Any

import numpy as np

from services.classifier.offline.calibration import expected_calibration_error
from services.classifier.offline.labelled import load_labelled
from services.classifier.offline.metrics import macro_f1
from services.classifier.offline.train import train_head
from shared.encoders.embeddings import Encoder
from shared.policy.clarity import DECIDE_THRESHOLD


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


def eval_intents(
    train_path: Path,
    test_path: Path,
    *,
    threshold: float = DECIDE_THRESHOLD,
    oos_label: str = "oos",
    finetune_epochs: float = 0.0,
    seed: int = 0,
    encoder: Encoder | None = None,
    c: float = 20.0,
    calibration_folds: int = 5,
    finetune_options: dict[str, Any] | None = None,
    embed_cache: Path | None = None,
    onnx_cache_dir: Path | None = None,
    sweep: tuple[float, ...] = (0.0, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9),
) -> dict[str, Any]:
    """Train on `train_path`, evaluate on `test_path`; see the module doc for the protocol.

    Returns accuracy, macro_f1, n_train, n_test, train_seconds (+ in_scope_accuracy,
    oos_recall when the test file has oos lines) and diagnostics (ECE, temperature,
    coverage, a threshold sweep). `embed_cache`: a directory caching the frozen
    encoder's vectors between runs; `onnx_cache_dir`: where the default encoder keeps
    its exported graph.
    """
    train_rows = load_labelled(train_path)
    test_rows = load_labelled(test_path)
    tr_texts, tr_labels = [t for t, _ in train_rows], [lab for _, lab in train_rows]
    te_texts, te_labels = [t for t, _ in test_rows], np.array([lab for _, lab in test_rows])

    if encoder is None:
        from shared.encoders.fast import FastEncoder

        encoder = FastEncoder(threads=max(1, os.cpu_count() or 1), cache_size=0,
                              onnx_cache_dir=onnx_cache_dir)

    started = time.perf_counter()
    vectors = None
    if not finetune_epochs:
        vectors = _encode_cached(encoder, tr_texts, embed_cache)
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
        finetune_epochs=finetune_epochs,
        argmax_accuracy=float((pred == te_labels).mean()),
        coverage_at_threshold=float(decided.mean()),
        accuracy_when_decided=float((pred[decided] == te_labels[decided]).mean())
        if decided.any()
        else 0.0,
        test_ece=expected_calibration_error(probs[known], y_idx[known]) if known.any() else None,
        temperature=head.temperature,
        cv_accuracy=head.metrics.get("cv_accuracy"),
        cv_ece_calibrated=head.metrics.get("ece_calibrated"),
        finetune_seconds=head.metrics.get("finetune_seconds"),
    )
    if open_set:
        result["sweep"] = {
            str(th): {k: round(v, 4) for k, v in scores(th).items()} for th in sweep
        }
    return result
