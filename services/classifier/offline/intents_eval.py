"""`eval intents`: train a Layer 2 head on one labelled file, score it on another.

Protocol
* Train on every line of `train_path` (for CLINC150 "full": in-scope + oos_train, the
  `oos` lines being one more class), with the `train_head` that trains the worker's
  heads (logistic regression + temperature scaling; optional encoder fine-tune), on
  the vectors of `INTENT_ENCODERS` side by side (see below) unless told otherwise.
* Without a fine-tune, the head's calibrated probabilities are mixed (weighted
  geometric mean, `mix_members`) with those of `ENSEMBLE_MEMBERS`: logistic regression
  on TF-IDF n-grams of the text and a cosine kNN over the same vectors, each fitted on
  the head's cross-validation folds; the weights are those that maximise the
  out-of-fold accuracy on the train split, and the threshold below is chosen on the
  out-of-fold mixture.
* The out-of-scope threshold: `threshold` when given; otherwise, when the train file
  has `oos_label` lines, the one that maximises the accuracy of the out-of-fold
  predictions on the train split (calibrated, the same folds the temperature is
  fitted on) with its `oos_label` lines weighted as `OOS_PRIOR` of the traffic; else
  the clarity gate's `DECIDE_THRESHOLD`. The test split chooses nothing.
* Open-set scoring applies when the test file has `oos_label` lines: a prediction
  whose calibrated confidence is below the threshold becomes `oos_label` (as does a
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from services.classifier.layer2.head import softmax
from services.classifier.offline.calibration import expected_calibration_error, fit_temperature
from services.classifier.offline.labelled import load_labelled
from services.classifier.offline.metrics import macro_f1
from services.classifier.offline.train import fit_logreg, full_logits, train_head
from shared.encoders.embeddings import DEFAULT_MODEL, Encoder
from shared.policy.clarity import DECIDE_THRESHOLD

# The frozen encoders whose vectors the head reads, side by side. Train CV on CLINC150 /
# HWU64: MiniLM 0.972 / 0.900, mpnet 0.977 / 0.904, both 0.978 / 0.914 (README
# "Encoders"; on the test splits 95.2 / 96.6 / 96.9% in-scope argmax, 90.9 / 90.8 / 92.3%).
INTENT_ENCODERS: tuple[str, ...] = (DEFAULT_MODEL, "all-mpnet-base-v2")
# The share of out-of-scope traffic the threshold is chosen for (see the module doc):
# CLINC150's own oos_train lines are 0.7% of its train split, too few to say.
OOS_PRIOR = 0.1
# The members mixed with the head (see `mix_members`): logistic regression on TF-IDF word
# 1-2grams + char_wb 2-5grams of the text (C = 10), and a cosine kNN over the head's
# vectors (k = 10, weights exp((cos - 1) / 0.05)). Train CV on HWU64 / CLINC150: the
# head 0.914 / 0.978, TF-IDF 0.879 / 0.949, kNN 0.874 / 0.947; mixed (weights chosen by
# that CV: 0.5/0.3/0.2 and 0.6/0.3/0.1) 0.926 / 0.981. On the test splits HWU64 went from
# 92.6 to 93.1%; CLINC150 from in-scope 96.7% / OOS recall 59.6% (threshold 0.38) to
# 96.2% / 71.7% (0.53), ahead of the head alone at equal thresholds from 0.5 up (README
# "Encoders"). Nearest centroids (CV 0.863 on HWU64) added nothing the kNN did not; a
# linear head with label smoothing on the vectors was below the head (0.906).
ENSEMBLE_MEMBERS: tuple[str, ...] = ("tfidf", "knn")
TFIDF_C = 10.0
KNN_K, KNN_TAU = 10, 0.05
# The grid of the mixture's weights (each a multiple of it, summing to 1).
MIX_STEP = 0.1


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


def oos_threshold(probs: np.ndarray, y: np.ndarray, labels: Sequence[str], oos_label: str,
                  prior: float = OOS_PRIOR) -> float | None:
    """The threshold maximising held-out accuracy with `oos_label` lines weighted as
    `prior` of all lines (in-scope as 1 - prior); None without such lines."""
    if oos_label not in labels:
        return None
    names = np.asarray(labels)[y]
    is_oos = names == oos_label
    if not is_oos.any() or is_oos.all():
        return None
    pred = np.asarray(labels)[probs.argmax(axis=1)]
    conf = probs.max(axis=1)
    best, best_th = -1.0, DECIDE_THRESHOLD
    for th in np.round(np.arange(0.0, 0.96, 0.01), 2):
        final = np.where(conf < th, oos_label, pred)
        score = ((1 - prior) * (final[~is_oos] == names[~is_oos]).mean()
                 + prior * (final[is_oos] == oos_label).mean())
        if score > best + 1e-12:
            best, best_th = float(score), float(th)
    return best_th


def _tfidf_logits(tr_texts: Sequence[str], y: np.ndarray, te_texts: Sequence[str],
                  folds: list[tuple[np.ndarray, np.ndarray]], n_classes: int, seed: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Out-of-fold and test logits of logistic regression on TF-IDF n-grams."""
    from scipy import sparse
    from sklearn.feature_extraction.text import TfidfVectorizer

    def fit_predict(a: Sequence[str], ya: np.ndarray, b: Sequence[str]) -> np.ndarray:
        vecs = (TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True),
                TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True,
                                min_df=2))
        xa = sparse.hstack([v.fit_transform(a) for v in vecs], format="csr")
        xb = sparse.hstack([v.transform(b) for v in vecs], format="csr")
        m = fit_logreg(xa, ya, c=TFIDF_C, seed=seed, max_iter=300)
        return full_logits(m, xb, n_classes)

    texts = np.asarray(tr_texts, dtype=object)
    oof = np.zeros((len(y), n_classes))
    for tr, te in folds:
        oof[te] = fit_predict(list(texts[tr]), y[tr], list(texts[te]))
    return oof, fit_predict(list(tr_texts), y, list(te_texts))


def _knn_logits(x_tr: np.ndarray, y: np.ndarray, x_te: np.ndarray,
                folds: list[tuple[np.ndarray, np.ndarray]], n_classes: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Out-of-fold and test log-scores of a cosine kNN (each of the `KNN_K` nearest
    lines adds exp((cos - 1) / `KNN_TAU`) to its label)."""

    def unit(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        return np.asarray(x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12))

    def scores(a: np.ndarray, ya: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = np.zeros((len(b), n_classes))
        k = min(KNN_K, len(a))
        for i in range(0, len(b), 1024):  # bounded memory: 1024 x len(a) cosines
            sim = b[i:i + 1024] @ a.T
            idx = np.argpartition(-sim, k - 1, axis=1)[:, :k]
            rows = np.arange(len(idx))[:, None]
            np.add.at(out[i:i + 1024], (rows, ya[idx]), np.exp((sim[rows, idx] - 1) / KNN_TAU))
        return np.asarray(np.log(out + 1e-6))

    a, b = unit(x_tr), unit(x_te)
    oof = np.zeros((len(y), n_classes))
    for tr, te in folds:
        oof[te] = scores(a[tr], y[tr], a[te])
    return oof, scores(a, y, b)


def mix_members(held: Sequence[np.ndarray], test: Sequence[np.ndarray], y: np.ndarray,
                step: float = MIX_STEP) -> tuple[tuple[float, ...], np.ndarray, np.ndarray]:
    """A weighted geometric mean of calibrated probabilities: the weights (multiples of
    `step` summing to 1; the first member's largest on ties) that maximise the held-out
    accuracy, then one temperature fitted on the held-out mixture. Returns the weights
    and the mixture's held-out and test probabilities."""
    import itertools

    logs = [np.log(np.clip(p, 1e-12, None)) for p in held]
    n = round(1 / step)
    grid = sorted((w for w in itertools.product(range(n + 1), repeat=len(held))
                   if sum(w) == n), reverse=True)
    best: tuple[float, tuple[int, ...]] = (-1.0, grid[0])
    for w in grid:
        acc = float((sum(wi * lp for wi, lp in zip(w, logs, strict=True)).argmax(axis=1)
                     == y).mean())
        if acc > best[0] + 1e-12:
            best = (acc, w)
    weights = tuple(wi / n for wi in best[1])
    mixed = sum(wi * lp for wi, lp in zip(weights, logs, strict=True))
    mixed_test = sum(wi * np.log(np.clip(p, 1e-12, None))
                     for wi, p in zip(weights, test, strict=True))
    temperature = fit_temperature(np.asarray(mixed), y)
    return (weights, softmax(np.asarray(mixed) / temperature),
            softmax(np.asarray(mixed_test) / temperature))


def _mixture(members: Sequence[str], head_held: np.ndarray, head_test: np.ndarray,
             y: np.ndarray, tr_texts: Sequence[str], te_texts: Sequence[str],
             vectors: np.ndarray, test_vecs: np.ndarray, *, calibration_folds: int,
             seed: int) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """The head mixed with `members` (each on the head's folds, temperature-scaled on its
    out-of-fold logits; see `mix_members`): a summary and the held-out and test
    probabilities."""
    from sklearn.model_selection import StratifiedKFold

    n_classes = head_held.shape[1]
    # The folds train_head's out-of-fold logits came from (they depend on y alone).
    n_folds = min(calibration_folds, int(np.bincount(y, minlength=n_classes).min()))
    folds = list(StratifiedKFold(n_splits=n_folds, shuffle=True, random_state=seed)
                 .split(np.zeros(len(y)), y))
    held, test = [head_held], [head_test]
    for name in members:
        if name == "tfidf":
            oof, te = _tfidf_logits(tr_texts, y, te_texts, folds, n_classes, seed)
        elif name == "knn":
            oof, te = _knn_logits(vectors, y, test_vecs, folds, n_classes)
        else:
            raise ValueError(f"unknown ensemble member {name!r} (tfidf, knn)")
        t = fit_temperature(oof, y)
        held.append(softmax(oof / t))
        test.append(softmax(te / t))
    weights, mixed_held, mixed_test = mix_members(held, test, y)
    summary = {
        "weights": dict(zip(("head", *members), weights, strict=True)),
        "member_cv_accuracy": {name: float((p.argmax(axis=1) == y).mean())
                               for name, p in zip(("head", *members), held, strict=True)},
        "cv_accuracy": float((mixed_held.argmax(axis=1) == y).mean()),
    }
    return summary, mixed_held, mixed_test


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
    sweep: tuple[float, ...] = (0.0, 0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9),
) -> dict[str, Any]:
    """Train on `train_path`, evaluate on `test_path`; see the module doc for the protocol.

    Returns accuracy, macro_f1, n_train, n_test, train_seconds (+ in_scope_accuracy,
    oos_recall when the test file has oos lines), the threshold and how it was chosen,
    and diagnostics (ECE, temperature, coverage, a threshold sweep). `encoder` (else
    `encoders` by name; a fine-tune starts from the first) gives the vectors;
    `lexical`: the head's char n-gram block (off: on HWU64 it took ~9x the training
    time for a lower train CV, 0.911 against 0.914). `members`: what the head is mixed
    with (() for the head alone; no mixture with a fine-tune). `embed_cache`: a directory
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
    if members and heldout and vectors is not None:
        started = time.perf_counter()
        mixture, heldout["probs"], probs = _mixture(
            members, heldout["probs"], probs, heldout["y"], tr_texts, te_texts, vectors,
            test_vecs, calibration_folds=calibration_folds, seed=seed)
        train_seconds += time.perf_counter() - started
    chosen = (oos_threshold(heldout["probs"], heldout["y"], head.labels, oos_label)
              if threshold is None and heldout else None)
    how = "given" if threshold is not None else "train-cv" if chosen is not None else "clarity"
    threshold = threshold if threshold is not None else chosen if chosen is not None \
        else DECIDE_THRESHOLD
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
        test_ece=expected_calibration_error(probs[known], y_idx[known]) if known.any() else None,
        temperature=head.temperature,
        cv_accuracy=mixture["cv_accuracy"] if mixture else head.metrics.get("cv_accuracy"),
        mixture=mixture,
        cv_ece_calibrated=head.metrics.get("ece_calibrated"),
        finetune_seconds=head.metrics.get("finetune_seconds"),
    )
    if open_set:
        result["sweep"] = {
            str(th): {k: round(v, 4) for k, v in scores(th).items()} for th in sweep
        }
    return result
