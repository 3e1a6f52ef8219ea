"""`train_head`: fit a calibrated Layer 2 head (logistic regression + temperature).

The head's input is the sentence vector with, unless `lexical` is None, a hashed char
n-gram block of the text beside it (`services.classifier.layer2.features`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from offline.classifier.calibration import expected_calibration_error, fit_temperature
from offline.classifier.classification_metrics import macro_f1
from services.classifier.layer2.features import LexicalFeatures
from services.classifier.layer2.head import EmbeddingHead, softmax
from shared.encoders.embeddings import DEFAULT_MODEL, Encoder
from shared.policy.clarity import DECIDE_THRESHOLD

log = logging.getLogger("intentroute.classifier.train")

# Hashed char n-grams beside the sentence vector. On the routing training data (5-fold
# CV) they took Layer 2 from 0.947 to 0.974 accuracy and the share it decides at 0.85
# from 0.87 to 0.94; (2,5)-grams at weight 1.5-2 did best of the settings tried.
DEFAULT_LEXICAL: dict[str, Any] = {
    "analyzer": "char_wb", "ngram_range": [2, 5], "n_features": 2**16, "weight": 2.0,
}


def head_features(
    vectors: np.ndarray, texts: Sequence[str] | None, lexical: LexicalFeatures | None
) -> Any:
    """The head's input: sentence vectors, with the lexical block beside them if any."""
    x = np.asarray(vectors, dtype=np.float32)
    if lexical is None:
        return x
    if texts is None:
        raise ValueError("this head reads the text too: pass texts with the vectors")
    from scipy import sparse

    return sparse.hstack([sparse.csr_matrix(x), lexical.transform(texts)], format="csr")


def data_hash(texts: Sequence[str], labels: Sequence[str]) -> str:
    """Order-independent sha256 of the (text, label) training lines."""
    h = hashlib.sha256()
    for line in sorted(f"{lab}\t{txt}" for txt, lab in zip(texts, labels, strict=True)):
        h.update(line.encode())
        h.update(b"\n")
    return h.hexdigest()


def fit_logreg(x: np.ndarray, y: np.ndarray, *, c: float, seed: int, max_iter: int) -> Any:
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return LogisticRegression(C=c, max_iter=max_iter, random_state=seed).fit(x, y)


def full_logits(model: Any, x: np.ndarray, n_classes: int) -> np.ndarray:
    """decision_function as (n, n_classes) logits; classes absent from the fit get -1e4."""
    d = np.asarray(model.decision_function(x), dtype=np.float64)
    out = np.full((x.shape[0], n_classes), -1e4, dtype=np.float64)
    cls = np.asarray(model.classes_)
    if d.ndim == 1:  # binary: symmetric two-logit form
        out[:, cls[0]], out[:, cls[1]] = -d / 2, d / 2
    else:
        out[:, cls] = d
    return out


def _shallow_encoder(head: EmbeddingHead, layers: int, onnx_cache_dir: Path | None,
                     model: str | None = None) -> Encoder:
    """`model` (default: `head`'s frozen encoder) at `head`'s precision, cut to its
    first `layers`."""
    from shared.encoders.fast import shared_fast_encoder

    return shared_fast_encoder(model or head.encoder, precision=head.precision or "fp32",
                               layers=layers, onnx_cache_dir=onnx_cache_dir)


def _calibration_holdout(
    labels: list[str], classes: list[str], fraction: float, seed: int
) -> np.ndarray:
    """Lines a fine-tune never sees: the temperature is fitted on them (out-of-fold
    logits of a fine-tuned encoder would be overconfident)."""
    y_all = np.searchsorted(classes, labels)
    rng = np.random.default_rng(seed)
    calib: list[int] = []
    for k in range(len(classes)):
        idx = np.flatnonzero(y_all == k)
        take = round(len(idx) * fraction)
        if len(idx) >= 3:
            calib.extend(rng.permutation(idx)[: max(1, take)].tolist())
    return np.array(sorted(calib), dtype=np.int64)


def _finetune(
    texts: list[str],
    labels: list[str],
    calib_idx: np.ndarray,
    encoder: Encoder | None,
    finetune_dir: Path | None,
    *,
    epochs: float,
    seed: int,
    progress: Callable[[str], None],
    options: dict[str, Any] | None,
) -> Path:
    """Fine-tune the encoder on the lines outside `calib_idx`; returns its directory."""
    import tempfile

    from offline.classifier.finetune import finetune_encoder

    fit_mask = np.ones(len(texts), dtype=bool)
    fit_mask[calib_idx] = False
    encoder_dir = Path(finetune_dir or tempfile.mkdtemp(prefix="intentroute-ft-"))
    base = getattr(encoder, "model_name", DEFAULT_MODEL) if encoder else DEFAULT_MODEL
    finetune_encoder(
        [t for t, keep in zip(texts, fit_mask, strict=True) if keep],
        [lab for lab, keep in zip(labels, fit_mask, strict=True) if keep],
        encoder_dir, base_model=str(base), epochs=epochs,
        seed=seed, progress=progress, **(options or {}),
    )
    return encoder_dir


def train_head(
    texts: Sequence[str],
    labels: Sequence[str],
    encoder: Encoder | None,
    *,
    seed: int = 0,
    c: float = 20.0,
    calibration_folds: int = 5,
    calibration_holdout: float = 0.1,
    max_iter: int = 500,
    finetune_epochs: float = 0.0,
    finetune_dir: Path | None = None,
    finetune_options: dict[str, Any] | None = None,
    vectors: np.ndarray | None = None,
    progress: Callable[[str], None] | None = None,
    lexical: dict[str, Any] | None = DEFAULT_LEXICAL,
    early_exit_layers: int | None = None,
    early_exit_model: str | None = None,
    on_heldout: Callable[[np.ndarray, np.ndarray], None] | None = None,
) -> EmbeddingHead:
    """Fit a calibrated logistic-regression head on sentence vectors (and, unless
    `lexical` is None, the texts' char n-gram block).

    * vectors come from `encoder` (or are passed precomputed in `vectors`),
    * `calibration_folds`-fold stratified CV gives out-of-fold logits: the temperature
      is fitted on them (NLL), and they also yield cross-validated accuracy/macro-F1
      and ECE before/after scaling (stored in `head.metrics`),
    * the final coefficients are fitted on all lines.
    * with fine-tuning, `calibration_holdout` of each label's lines is kept out of the
      fine-tune; the temperature (and the cv_* metrics) come from those lines.
    * `early_exit_layers` also trains `head.early`, the same recipe on the first layers
      of `early_exit_model` (default: the head's own encoder; 0: its embedding module
      alone; frozen encoder only).
    * `on_heldout(probs, y)` receives the calibrated probabilities of the held-out lines
      (out-of-fold, or held out of the fine-tune) and their label indices (into the
      sorted labels): what `eval intents` chooses its out-of-scope threshold on.
    * `finetune_epochs > 0` first fine-tunes the encoder (`offline.finetune`) and trains
      the head on the fine-tuned vectors; the head then carries the encoder (saved next
      to its coefficients).
    """
    say = progress or log.info
    texts = list(texts)
    labels = [str(lab) for lab in labels]
    if len(texts) != len(labels) or not texts:
        raise ValueError("texts and labels must be non-empty and aligned")
    classes = sorted(set(labels))
    if len(classes) < 2:
        raise ValueError("need at least two labels")
    started = time.perf_counter()
    encoder_dir: Path | None = None
    finetune_seconds = 0.0
    calib_idx: np.ndarray | None = None
    if finetune_epochs and finetune_epochs > 0:
        t0 = time.perf_counter()
        calib_idx = _calibration_holdout(labels, classes, calibration_holdout, seed)
        encoder_dir = _finetune(texts, labels, calib_idx, encoder, finetune_dir,
                                epochs=finetune_epochs, seed=seed, progress=say,
                                options=finetune_options)
        finetune_seconds = time.perf_counter() - t0
        encoder = _finetuned_encoder(encoder_dir)
        vectors = None
    x = head_features(_encode(texts, encoder, vectors, say), texts,
                      LexicalFeatures(lexical) if lexical else None)
    y = np.searchsorted(classes, labels)
    counts = np.bincount(y, minlength=len(classes))

    metrics: dict[str, Any] = {
        "n_train": len(texts),
        "n_labels": len(classes),
        "class_counts": {c_: int(n) for c_, n in zip(classes, counts, strict=True)},
        "C": c,
        "seed": seed,
        "lexical": lexical,
        "data_hash": data_hash(texts, labels),
    }
    fit = partial(fit_logreg, c=c, seed=seed, max_iter=max_iter)
    held, held_y = _calibration_logits(
        x, y, len(classes), calib_idx, min(calibration_folds, int(counts.min())),
        fit=fit, seed=seed, metrics=metrics, say=say)
    temperature = 1.0
    if held is not None and held_y is not None:
        temperature = _calibrate(held, held_y, classes, metrics)
        if on_heldout is not None:
            on_heldout(softmax(held / temperature), held_y)
    say("final fit on all lines")
    coef, intercept = _final_fit(x, y, len(classes), fit)
    metrics.update(
        temperature=temperature,
        finetune_epochs=float(finetune_epochs or 0.0),
        finetune_seconds=round(finetune_seconds, 2),
        train_seconds=round(time.perf_counter() - started, 2),
    )
    head = EmbeddingHead(
        classes,
        coef,
        intercept,
        temperature=temperature,
        encoder=str(getattr(encoder, "model_name", DEFAULT_MODEL)) if encoder_dir is None
        else DEFAULT_MODEL,
        encoder_dir=encoder_dir,
        metrics=metrics,
        meta={"data_hash": metrics["data_hash"], "trained_at": time.time()},
        lexical=lexical,
        precision=getattr(encoder, "precision", None) if encoder_dir is None else None,
        layers=getattr(encoder, "layers", None) if encoder_dir is None else None,
    )
    if early_exit_layers is not None:
        if encoder_dir is not None:
            raise ValueError("early exit needs the frozen encoder (no fine-tune)")
        _train_early_exit(head, encoder, texts, labels, early_exit_layers, seed=seed, c=c,
                          calibration_folds=calibration_folds, max_iter=max_iter,
                          lexical=lexical, say=say, model=early_exit_model)
    return head


def _finetuned_encoder(encoder_dir: Path) -> Encoder:
    """The fine-tuned encoder in `encoder_dir`, its exported graph kept in the same
    directory (it lives and goes with it; a head's save copies the encoder without it)."""
    from shared.encoders.fast import FastEncoder

    return FastEncoder(encoder_dir, threads=max(1, os.cpu_count() or 1), cache_size=0,
                       onnx_cache_dir=encoder_dir / "onnx")


def _encode(texts: list[str], encoder: Encoder | None, vectors: np.ndarray | None,
            say: Callable[[str], None]) -> np.ndarray:
    """The sentence vectors: `vectors` when given, else `encoder`'s."""
    if vectors is not None:
        return vectors
    if encoder is None:
        raise ValueError("an encoder or precomputed vectors are required")
    say(f"encoding {len(texts)} lines")
    return encoder.encode(texts, batch_size=64)


def _calibration_logits(
    x: Any, y: np.ndarray, n_classes: int, calib_idx: np.ndarray | None, folds: int, *,
    fit: Callable[[Any, np.ndarray], Any], seed: int, metrics: dict[str, Any],
    say: Callable[[str], None],
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Logits of lines the fit did not see, and their labels: the lines held out of a
    fine-tune (a fit on the others), else `folds`-fold out-of-fold logits; (None, None)
    when neither is possible. `metrics["cv_folds"]` says which."""
    if calib_idx is not None and len(calib_idx) and len(set(y[calib_idx])) >= 2:
        say(f"calibration on {len(calib_idx)} lines held out of the fine-tune")
        fit_mask = np.ones(len(y), dtype=bool)
        fit_mask[calib_idx] = False
        m = fit(x[fit_mask], y[fit_mask])
        metrics["cv_folds"] = "holdout"
        return full_logits(m, x[calib_idx], n_classes), y[calib_idx]
    if folds >= 2:
        from sklearn.model_selection import StratifiedKFold

        say(f"{folds}-fold out-of-fold logits for calibration")
        held = np.zeros((len(y), n_classes), dtype=np.float64)
        skf = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
        for tr, te in skf.split(x, y):
            m = fit(x[tr], y[tr])
            # A fold may miss a class only when counts < folds, excluded above.
            held[te] = full_logits(m, x[te], n_classes)
        metrics["cv_folds"] = folds
        return held, y
    return None, None


def _calibrate(held: np.ndarray, held_y: np.ndarray, classes: list[str],
               metrics: dict[str, Any]) -> float:
    """The temperature fitted on the held-out logits; their accuracy, macro-F1, ECE
    before/after scaling and share decided go into `metrics`."""
    temperature = fit_temperature(held, held_y)
    raw, cal = softmax(held.copy()), softmax(held / temperature)
    pred = cal.argmax(axis=1)
    decided = cal.max(axis=1) > DECIDE_THRESHOLD
    metrics.update(
        cv_n=len(held_y),
        cv_accuracy=float((pred == held_y).mean()),
        cv_macro_f1=macro_f1([classes[i] for i in held_y], [classes[i] for i in pred]),
        ece_uncalibrated=expected_calibration_error(raw, held_y),
        ece_calibrated=expected_calibration_error(cal, held_y),
        cv_decided_at_0_85=float(decided.mean()),
        cv_accuracy_when_decided=float((pred == held_y)[decided].mean())
        if decided.any()
        else 0.0,
    )
    return temperature


def _final_fit(x: Any, y: np.ndarray, n_classes: int, fit: Callable[[Any, np.ndarray], Any]
               ) -> tuple[np.ndarray, np.ndarray]:
    """The head's coefficients and intercepts, fitted on all lines (sklearn's binary form
    made a symmetric two-row softmax)."""
    model = fit(x, y)
    coef, intercept = model.coef_, model.intercept_
    if n_classes == 2:
        coef = np.vstack([-coef[0] / 2, coef[0] / 2])
        intercept = np.array([-intercept[0] / 2, intercept[0] / 2])
    return coef, intercept


def _train_early_exit(head: EmbeddingHead, encoder: Encoder | None, texts: list[str],
                      labels: list[str], layers: int, *, seed: int, c: float,
                      calibration_folds: int, max_iter: int, lexical: dict[str, Any] | None,
                      say: Callable[[str], None], model: str | None = None) -> None:
    """`head.early`: the same recipe on the first `layers` of `model` (default: the
    head's frozen encoder); its CV metrics summarised in `head.metrics["early_exit"]`."""
    say(f"early-exit head on the first {layers} layers of {model or head.encoder}")
    head.early = train_head(
        texts, labels,
        _shallow_encoder(head, layers, getattr(encoder, "onnx_cache_dir", None), model),
        seed=seed,
        c=c, calibration_folds=calibration_folds, max_iter=max_iter, progress=say,
        lexical=lexical)
    head.metrics["early_exit"] = {
        k: head.early.metrics.get(k)
        for k in ("cv_accuracy", "cv_macro_f1", "cv_decided_at_0_85",
                  "cv_accuracy_when_decided", "temperature")}
