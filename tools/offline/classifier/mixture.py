"""What `eval intents` mixes with the head: other members, a fine-tuned encoder, and
the out-of-scope prior.

* `mix_frozen`: the head's out-of-fold probabilities mixed (weighted geometric mean,
  `mix_members`) with `ENSEMBLE_MEMBERS` fitted on the same folds: logistic regression on
  TF-IDF n-grams and a cosine kNN over the head's frozen vectors.
* `mix_tuned`: that mixture mixed again with a fine-tuned encoder's cosine classifier
  (`offline.finetune`), trained on the lines outside the first fold; its weight and
  temperature come from that fold (the one set of train lines it has not seen).
* `prior_shift`: the probabilities as they would be with `oos` lines `OOS_PRIOR` of the
  traffic instead of their share of the train split.

Every weight, temperature and threshold is chosen on held-out train lines; the test split
chooses nothing. Offline only (see the package's `__init__`).
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from offline.classifier.calibration import fit_temperature
from offline.classifier.train import fit_logreg, full_logits
from services.classifier.layer2.head import softmax
from shared.encoders.embeddings import DEFAULT_MODEL

# The members mixed with the head (see `mix_members`): logistic regression on TF-IDF word
# 1-2grams + char_wb 2-5grams of the text (C = 10), and a cosine kNN over the head's
# vectors (k = 10, weights exp((cos - 1) / 0.05)). Train CV on HWU64 / CLINC150: the
# head 0.914 / 0.978, TF-IDF 0.879 / 0.949, kNN 0.874 / 0.947; mixed (weights chosen by
# that CV: 0.5/0.3/0.2 and 0.6/0.3/0.1) 0.926 / 0.981. On the test splits HWU64 went from
# 92.6 to 93.1%; CLINC150 from in-scope 96.7% / OOS recall 59.6% (threshold 0.38) to
# 96.2% / 71.7% (0.53), ahead of the head alone at equal thresholds from 0.5 up (docs/
# explanation/encoders.md). Nearest centroids (CV 0.863 on HWU64) added nothing the kNN did not; a
# linear head with label smoothing on the vectors was below the head (0.906).
ENSEMBLE_MEMBERS: tuple[str, ...] = ("tfidf", "knn")
TFIDF_C = 10.0
KNN_K, KNN_TAU = 10, 0.05
# The grid of the mixture's weights (each a multiple of it, summing to 1).
MIX_STEP = 0.1


# The fine-tuned member (`mix_tuned`): MiniLM, 4 epochs, label smoothing 0.1, on the
# lines outside the first fold (`python -m bench.intents_finetune`'s recipe: its own
# cosine classifier reached 96.9% in-scope argmax on CLINC150 trained on every line).
# CLINC150: 1,512 steps, 21 min on one core of the 2-core machine beside another job;
# its cosine classifier alone 98.0% on the held fold; mixed with the frozen mixture at
# 0.3 (chosen on that fold) in-scope argmax went from 96.8 to 97.2% on the test split.
TUNE_EPOCHS = 4.0
TUNE_SMOOTHING = 0.1
TUNE_SCALE = 30.0  # the cosine classifier's fixed scale (finetune_encoder's default)
# The share of out-of-scope traffic the decision is made for: `prior_shift` and the
# threshold (intents_eval.oos_threshold). CLINC150's own oos_train lines are 0.7% of its
# train split, too few to say.
OOS_PRIOR = 0.1

def head_folds(y: np.ndarray, calibration_folds: int, seed: int
               ) -> list[tuple[np.ndarray, np.ndarray]]:
    """The folds train_head's out-of-fold logits came from (they depend on y alone)."""
    from sklearn.model_selection import StratifiedKFold

    n_folds = min(calibration_folds, int(np.bincount(y).min()))
    return list(StratifiedKFold(n_splits=n_folds, shuffle=True, random_state=seed)
                .split(np.zeros(len(y)), y))


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


def mix_frozen(members: Sequence[str], head_held: np.ndarray, head_test: np.ndarray,
             y: np.ndarray, tr_texts: Sequence[str], te_texts: Sequence[str],
             vectors: np.ndarray, test_vecs: np.ndarray, *, calibration_folds: int,
             seed: int) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """The head mixed with `members` (each on the head's folds, temperature-scaled on its
    out-of-fold logits; see `mix_members`): a summary and the held-out and test
    probabilities."""
    n_classes = head_held.shape[1]
    folds = head_folds(y, calibration_folds, seed)
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


def mix_tuned(frozen_held: np.ndarray, frozen_test: np.ndarray, y: np.ndarray,
              labels: Sequence[str], tr_texts: Sequence[str], te_texts: Sequence[str], *,
              calibration_folds: int, seed: int, epochs: float = TUNE_EPOCHS,
              progress_bar: bool = True) -> tuple[dict[str, Any], np.ndarray]:
    """`frozen_held` / `frozen_test` (the frozen mixture's out-of-fold and test
    probabilities) mixed with a fine-tuned encoder's cosine classifier: fine-tuned on the
    lines outside the first of the head's folds, its temperature and its weight in the
    mixture chosen on that fold's lines (`mix_members`). Returns a summary and the test
    split's probabilities."""
    from offline.classifier.finetune import finetune_encoder, load_cosine_head
    from shared.encoders.fast import FastEncoder

    fit_idx, held_idx = head_folds(y, calibration_folds, seed)[0]
    names = np.asarray(labels)
    out_dir = Path(tempfile.mkdtemp(prefix="intentroute-ft-"))
    try:
        report = finetune_encoder(
            [tr_texts[i] for i in fit_idx], [str(names[y[i]]) for i in fit_idx], out_dir,
            base_model=DEFAULT_MODEL, epochs=epochs, label_smoothing=TUNE_SMOOTHING,
            scale=TUNE_SCALE, threads=max(1, os.cpu_count() or 1), seed=seed,
            progress=lambda _: None, progress_bar=progress_bar)
        weights, tuned_labels = load_cosine_head(out_dir)
        encoder = FastEncoder(out_dir, threads=max(1, os.cpu_count() or 1), cache_size=0,
                              onnx_cache_dir=out_dir / "onnx")
        logits_of = {}
        for name, texts in (("held", [tr_texts[i] for i in held_idx]), ("test", te_texts)):
            cos = encoder.encode(list(texts), batch_size=64) @ weights.T
            # A class with no line outside the held fold was not fine-tuned on: the
            # lowest cosine (the frozen mixture still scores it).
            full = np.full((len(cos), len(labels)), -1.0)
            full[:, np.searchsorted(labels, tuned_labels)] = cos
            logits_of[name] = TUNE_SCALE * full
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    t = fit_temperature(logits_of["held"], y[held_idx])
    tuned_held, tuned_test = softmax(logits_of["held"] / t), softmax(logits_of["test"] / t)
    mix, held, test = mix_members([frozen_held[held_idx], tuned_held],
                                  [frozen_test, tuned_test], y[held_idx])
    summary = {
        "weights": {"frozen": mix[0], "tuned": mix[1]},
        "tuned_fold_accuracy": float((tuned_held.argmax(axis=1) == y[held_idx]).mean()),
        "fold_accuracy": float((held.argmax(axis=1) == y[held_idx]).mean()),
        "fold_lines": len(held_idx),
        "finetune": report,
    }
    return summary, test


def prior_shift(probs: np.ndarray, labels: Sequence[str], oos_label: str,
                train_share: float, prior: float = OOS_PRIOR) -> np.ndarray:
    """`probs` as they would be if `oos_label` lines were `prior` of the traffic instead
    of `train_share` (Bayes' rule: its column scaled by the ratio of the odds, each row
    normalised again); unchanged without such a label or share."""
    if oos_label not in labels or not 0 < train_share < 1:
        return probs
    k = list(labels).index(oos_label)
    out = np.array(probs, dtype=float, copy=True)
    out[:, k] *= (prior / (1 - prior)) / (train_share / (1 - train_share))
    out /= out.sum(axis=1, keepdims=True)
    return out
