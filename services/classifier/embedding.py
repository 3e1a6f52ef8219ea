"""Layer 2 of the classifier cascade: embedding head with calibrated confidence.

Pieces (ADR-0008 "Future Path", ADR-018 clarity gate):

* `EmbeddingHead`   multinomial logistic regression over L2-normalised sentence
                    vectors plus hashed character n-grams of the text (the encoder
                    is English-only; n-grams carry Spanish wording and command
                    names), temperature-scaled on out-of-fold logits so that
                    `max(probabilities)` is a calibrated confidence (ECE reported).
                    Stored as .npy coefficients + JSON (no pickle). A head trained on
                    a fine-tuned encoder carries the encoder weights in `dir/encoder/`.
* `train_head`      fit (optionally after fine-tuning the encoder) + calibration.
* `HeadRegistry`    versioned heads on disk (`root/v0001`, ..., `CURRENT` pointer
                    written atomically), shadow-evaluated promotion, hot reload.
* `Layer2Classifier` encoder + current head -> `Prediction`.
* `MicroBatcher`    async front: concurrent submissions are encoded together in one
                    worker thread so the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from shared.contracts.routing import Clarity
from shared.embeddings import DEFAULT_MODEL, Encoder

log = logging.getLogger("intentroute.classifier.embedding")

HEAD_FORMAT = 1
DEFAULT_THRESHOLD = 0.85  # ADR-018: > 0.85 clear
EARLY_DIR = "early"  # the early-exit head's subdirectory in a head directory
CONFIRM_THRESHOLD = 0.65  # ADR-018: 0.65-0.85 needs confirmation, < 0.65 clarification
_VERSION_PREFIX = "v"
# Hashed char n-grams beside the sentence vector. On the routing training data (5-fold
# CV) they took Layer 2 from 0.947 to 0.974 accuracy and the share it decides at 0.85
# from 0.87 to 0.94; (2,5)-grams at weight 1.5-2 did best of the settings tried.
DEFAULT_LEXICAL: dict[str, Any] = {
    "analyzer": "char_wb", "ngram_range": [2, 5], "n_features": 2**16, "weight": 2.0,
}


# ---------------------------------------------------------------------------------
# numerics
# ---------------------------------------------------------------------------------
def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=1, keepdims=True)
    return z


def expected_calibration_error(probs: np.ndarray, y: np.ndarray, bins: int = 15) -> float:
    """Top-label ECE with equal-width confidence bins."""
    conf = probs.max(axis=1)
    correct = probs.argmax(axis=1) == y
    edges = np.linspace(0.0, 1.0, bins + 1)
    ece = 0.0
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        m = (conf > lo) & (conf <= hi)
        if m.any():
            ece += m.mean() * abs(conf[m].mean() - correct[m].mean())
    return float(ece)


def fit_temperature(logits: np.ndarray, y: np.ndarray) -> float:
    """Scalar temperature minimising held-out NLL (golden-section on log T)."""

    def nll(log_t: float) -> float:
        z = logits / np.exp(log_t)
        z = z - z.max(axis=1, keepdims=True)
        lse = np.log(np.exp(z).sum(axis=1))
        return float((lse - z[np.arange(len(y)), y]).mean())

    lo, hi = np.log(0.02), np.log(50.0)
    g = (np.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = nll(a), nll(b)
    for _ in range(60):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = nll(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = nll(b)
    return float(np.exp((lo + hi) / 2))


class LexicalFeatures:
    """Stateless hashed char n-gram block (nothing to fit, nothing to store but its
    settings): l2-normalised counts scaled by `weight`."""

    def __init__(self, settings: dict[str, Any]) -> None:
        from sklearn.feature_extraction.text import HashingVectorizer

        self.settings = dict(settings)
        self.weight = float(settings.get("weight", 1.0))
        self.n_features = int(settings["n_features"])
        self._hasher = HashingVectorizer(
            analyzer=settings.get("analyzer", "char_wb"),
            ngram_range=tuple(settings.get("ngram_range", (2, 5))),
            n_features=self.n_features,
            alternate_sign=False,
            norm="l2",
            lowercase=True,
        )

    def transform(self, texts: Sequence[str]) -> Any:
        return self._hasher.transform(list(texts)) * self.weight


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


def macro_f1(y_true: Sequence[str] | np.ndarray, y_pred: Sequence[str] | np.ndarray) -> float:
    from sklearn.metrics import f1_score

    return float(f1_score(list(y_true), list(y_pred), average="macro", zero_division=0))


# ---------------------------------------------------------------------------------
# head
# ---------------------------------------------------------------------------------
class EmbeddingHead:
    """Calibrated linear head: p = softmax((x @ coef.T + intercept) / temperature), x the
    sentence vector followed (when `lexical` is set) by the text's char n-gram block."""

    def __init__(
        self,
        labels: list[str],
        coef: np.ndarray,
        intercept: np.ndarray,
        *,
        temperature: float = 1.0,
        encoder: str = DEFAULT_MODEL,
        encoder_dir: Path | None = None,
        metrics: dict[str, Any] | None = None,
        meta: dict[str, Any] | None = None,
        lexical: dict[str, Any] | None = None,
        precision: str | None = None,
        layers: int | None = None,
        early: EmbeddingHead | None = None,
    ) -> None:
        self.labels = list(labels)
        # The encoder's first `layers` layers only (None: all of them).
        self.layers = layers
        # Early exit: a head on a shallower encoder that decides alone when it is sure;
        # only the messages it is unsure of pay for this head's full encoder.
        self.early = early
        # Encoder precision the training vectors came from (fp32 / int8 / int8-block);
        # None: the process default. Serving with the same keeps train and serve alike.
        self.precision = precision
        self.lexical = LexicalFeatures(lexical) if lexical else None
        self._blocks_t: tuple[np.ndarray, np.ndarray] | None = None
        self.coef = np.ascontiguousarray(coef, dtype=np.float32)
        self.intercept = np.ascontiguousarray(intercept, dtype=np.float32)
        if self.coef.shape[0] != len(self.labels):
            raise ValueError("coef rows must match labels")
        self.temperature = float(temperature)
        # Name of the base encoder the vectors come from ...
        self.encoder = encoder
        # ... or a fine-tuned encoder directory (copied into the head dir on save).
        self.encoder_dir = Path(encoder_dir) if encoder_dir else None
        self.metrics: dict[str, Any] = dict(metrics or {})
        self.meta: dict[str, Any] = dict(meta or {})

    @property
    def dim(self) -> int:
        """Width of the sentence vectors the head reads."""
        extra = self.lexical.n_features if self.lexical is not None else 0
        return int(self.coef.shape[1]) - extra

    @property
    def has_own_encoder(self) -> bool:
        return self.encoder_dir is not None

    def logits(self, vectors: np.ndarray, texts: Sequence[str] | None = None) -> np.ndarray:
        x = np.asarray(vectors, dtype=np.float32)
        if x.ndim == 1:
            x = x[None, :]
        dense_t, lexical_t = self._blocks()
        z = x @ dense_t + self.intercept
        if self.lexical is not None:
            if texts is None:
                raise ValueError("this head reads the text too: pass texts with the vectors")
            z = z + np.asarray(self.lexical.transform(texts) @ lexical_t)
        return np.asarray(z / self.temperature)

    def _blocks(self) -> tuple[np.ndarray, np.ndarray]:
        """coef split by input block, transposed and contiguous once (a strided slice
        made the sparse product copy the lexical block on every message)."""
        if self._blocks_t is None:
            dim = self.dim
            self._blocks_t = (np.ascontiguousarray(self.coef[:, :dim].T),
                              np.ascontiguousarray(self.coef[:, dim:].T))
        return self._blocks_t

    def predict_proba(
        self, vectors: np.ndarray, texts: Sequence[str] | None = None
    ) -> np.ndarray:
        return softmax(self.logits(vectors, texts).astype(np.float64))

    def with_layers(self, layers: int) -> EmbeddingHead:
        """An empty head of the same encoder and precision cut to `layers` (its encoder)."""
        return EmbeddingHead(self.labels, np.zeros((len(self.labels), 1)),
                             np.zeros(len(self.labels)), encoder=self.encoder,
                             encoder_dir=self.encoder_dir, precision=self.precision,
                             layers=layers)

    def make_encoder(self, *, threads: int = 1) -> Encoder:
        """The encoder this head expects (fast path; fine-tuned weights if any)."""
        from shared.fast_encoder import FastEncoder, shared_fast_encoder

        if self.encoder_dir is not None:
            return FastEncoder(self.encoder_dir, threads=threads, layers=self.layers)
        return shared_fast_encoder(self.encoder, threads=threads, precision=self.precision,
                                   layers=self.layers)

    # -- persistence: coefficients as .npy, everything else JSON ----------------------
    def save(self, directory: Path) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        np.save(d / "coef.npy", self.coef, allow_pickle=False)
        np.save(d / "intercept.npy", self.intercept, allow_pickle=False)
        encoder_ref = self.encoder
        if self.encoder_dir is not None:
            target = d / "encoder"
            if self.encoder_dir.resolve() != target.resolve():
                if target.exists():
                    shutil.rmtree(target)
                shutil.copytree(self.encoder_dir, target, ignore=shutil.ignore_patterns("onnx"))
            encoder_ref = "encoder"
        head = {
            "format": HEAD_FORMAT,
            "kind": "logreg-temperature",
            "labels": self.labels,
            "temperature": self.temperature,
            "encoder": encoder_ref,
            "fine_tuned_encoder": self.encoder_dir is not None,
            "dim": self.dim,
            "lexical": self.lexical.settings if self.lexical is not None else None,
            "encoder_precision": self.precision,
            "encoder_layers": self.layers,
            "meta": self.meta,
        }
        if self.early is not None:
            self.early.save(d / EARLY_DIR)
        (d / "head.json").write_text(json.dumps(head, indent=2, ensure_ascii=False))
        (d / "metrics.json").write_text(json.dumps(self.metrics, indent=2, ensure_ascii=False))
        return d

    @classmethod
    def load(cls, directory: Path) -> EmbeddingHead:
        d = Path(directory)
        head = json.loads((d / "head.json").read_text())
        if head.get("format") != HEAD_FORMAT:
            raise ValueError(f"{d}: unsupported head format {head.get('format')}")
        metrics_path = d / "metrics.json"
        metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else {}
        encoder_dir = d / head["encoder"] if head.get("fine_tuned_encoder") else None
        return cls(
            head["labels"],
            np.load(d / "coef.npy", allow_pickle=False),
            np.load(d / "intercept.npy", allow_pickle=False),
            temperature=head.get("temperature", 1.0),
            encoder=DEFAULT_MODEL if encoder_dir else head.get("encoder", DEFAULT_MODEL),
            encoder_dir=encoder_dir,
            metrics=metrics,
            meta=head.get("meta", {}),
            lexical=head.get("lexical"),
            precision=head.get("encoder_precision"),
            layers=head.get("encoder_layers"),
            early=cls.load(d / EARLY_DIR) if (d / EARLY_DIR / "head.json").exists() else None,
        )


def _fit_logreg(x: np.ndarray, y: np.ndarray, *, c: float, seed: int, max_iter: int) -> Any:
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return LogisticRegression(C=c, max_iter=max_iter, random_state=seed).fit(x, y)


def _full_logits(model: Any, x: np.ndarray, n_classes: int) -> np.ndarray:
    """decision_function as (n, n_classes) logits; classes absent from the fit get -1e4."""
    d = np.asarray(model.decision_function(x), dtype=np.float64)
    out = np.full((x.shape[0], n_classes), -1e4, dtype=np.float64)
    cls = np.asarray(model.classes_)
    if d.ndim == 1:  # binary: symmetric two-logit form
        out[:, cls[0]], out[:, cls[1]] = -d / 2, d / 2
    else:
        out[:, cls] = d
    return out


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
    * `early_exit_layers` also trains `head.early`, the same recipe on the encoder's
      first layers (0: its embedding module alone; frozen encoder only).
    * `finetune_epochs > 0` first fine-tunes the encoder (services.classifier.finetune)
      and trains the head on the fine-tuned vectors; the head then carries the
      encoder (saved next to its coefficients).
    """
    from sklearn.model_selection import StratifiedKFold

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
        import tempfile

        from services.classifier.finetune import finetune_encoder

        # Lines the fine-tune never sees: the temperature is fitted on them (out-of-fold
        # logits of a fine-tuned encoder would be overconfident).
        y_all = np.searchsorted(classes, labels)
        rng = np.random.default_rng(seed)
        calib: list[int] = []
        for k in range(len(classes)):
            idx = np.flatnonzero(y_all == k)
            take = int(round(len(idx) * calibration_holdout))
            if len(idx) >= 3:
                calib.extend(rng.permutation(idx)[: max(1, take)].tolist())
        calib_idx = np.array(sorted(calib), dtype=np.int64)
        fit_mask = np.ones(len(texts), dtype=bool)
        fit_mask[calib_idx] = False
        t0 = time.perf_counter()
        encoder_dir = Path(finetune_dir or tempfile.mkdtemp(prefix="intentroute-ft-"))
        base = getattr(encoder, "model_name", DEFAULT_MODEL) if encoder else DEFAULT_MODEL
        finetune_encoder(
            [t for t, keep in zip(texts, fit_mask, strict=True) if keep],
            [lab for lab, keep in zip(labels, fit_mask, strict=True) if keep],
            encoder_dir, base_model=str(base), epochs=finetune_epochs,
            seed=seed, progress=say, **(finetune_options or {}),
        )
        finetune_seconds = time.perf_counter() - t0
        from shared.fast_encoder import FastEncoder

        encoder = FastEncoder(encoder_dir, threads=max(1, os.cpu_count() or 1), cache_size=0)
        vectors = None
    if vectors is None:
        if encoder is None:
            raise ValueError("an encoder or precomputed vectors are required")
        say(f"encoding {len(texts)} lines")
        vectors = encoder.encode(texts, batch_size=64)
    x = head_features(vectors, texts, LexicalFeatures(lexical) if lexical else None)
    y = np.searchsorted(classes, labels)
    counts = np.bincount(y, minlength=len(classes))

    folds = min(calibration_folds, int(counts.min()))
    metrics: dict[str, Any] = {
        "n_train": len(texts),
        "n_labels": len(classes),
        "class_counts": {c_: int(n) for c_, n in zip(classes, counts, strict=True)},
        "C": c,
        "seed": seed,
        "lexical": lexical,
        "data_hash": data_hash(texts, labels),
    }
    temperature = 1.0
    held: np.ndarray | None = None  # calibration logits ...
    held_y: np.ndarray | None = None  # ... and their labels
    if calib_idx is not None and len(calib_idx) and len(set(y[calib_idx])) >= 2:
        say(f"calibration on {len(calib_idx)} lines held out of the fine-tune")
        fit_mask = np.ones(len(y), dtype=bool)
        fit_mask[calib_idx] = False
        m = _fit_logreg(x[fit_mask], y[fit_mask], c=c, seed=seed, max_iter=max_iter)
        held = _full_logits(m, x[calib_idx], len(classes))
        held_y = y[calib_idx]
        metrics["cv_folds"] = "holdout"
    elif folds >= 2:
        say(f"{folds}-fold out-of-fold logits for calibration")
        held = np.zeros((len(y), len(classes)), dtype=np.float64)
        skf = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
        for tr, te in skf.split(x, y):
            m = _fit_logreg(x[tr], y[tr], c=c, seed=seed, max_iter=max_iter)
            # A fold may miss a class only when counts < folds, excluded above.
            held[te] = _full_logits(m, x[te], len(classes))
        held_y = y
        metrics["cv_folds"] = folds
    if held is not None and held_y is not None:
        temperature = fit_temperature(held, held_y)
        raw, cal = softmax(held.copy()), softmax(held / temperature)
        pred = cal.argmax(axis=1)
        decided = cal.max(axis=1) > DEFAULT_THRESHOLD
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
    say("final fit on all lines")
    model = _fit_logreg(x, y, c=c, seed=seed, max_iter=max_iter)
    coef, intercept = model.coef_, model.intercept_
    if len(classes) == 2:  # sklearn's binary form -> symmetric two-row softmax
        coef = np.vstack([-coef[0] / 2, coef[0] / 2])
        intercept = np.array([-intercept[0] / 2, intercept[0] / 2])
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
        say(f"early-exit head on the encoder's first {early_exit_layers} layers")
        head.early = train_head(
            texts, labels, head.with_layers(early_exit_layers).make_encoder(), seed=seed,
            c=c, calibration_folds=calibration_folds, max_iter=max_iter, progress=say,
            lexical=lexical)
        head.metrics["early_exit"] = {
            k: head.early.metrics.get(k)
            for k in ("cv_accuracy", "cv_macro_f1", "cv_decided_at_0_85",
                      "cv_accuracy_when_decided", "temperature")}
    return head


# ---------------------------------------------------------------------------------
# predictions
# ---------------------------------------------------------------------------------
class Prediction(msgspec.Struct, frozen=True):
    label: str
    confidence: float
    probabilities: dict[str, float]
    # Every other label, best first: (label, probability).
    alternatives: list[tuple[str, float]]
    head_version: str | None = None
    # Decided by the head's early exit (the shallow encoder) alone.
    early_exit: bool = False


def decides(prediction: Prediction, threshold: float = DEFAULT_THRESHOLD) -> bool:
    """Layer 2 decides when its calibrated confidence clears the threshold (ADR-0008)."""
    return prediction.confidence >= threshold


def clarity(confidence: float) -> Clarity:
    """ADR-018 clarity gate for a confidence."""
    if confidence >= DEFAULT_THRESHOLD:
        return Clarity.CLEAR
    if confidence >= CONFIRM_THRESHOLD:
        return Clarity.NEEDS_CONFIRMATION
    return Clarity.NEEDS_CLARIFICATION


def _predictions(
    head: EmbeddingHead, vectors: np.ndarray, texts: Sequence[str], version: str | None
) -> list[Prediction]:
    probs = head.predict_proba(vectors, texts)
    out: list[Prediction] = []
    labels = head.labels
    for row in probs:
        order = np.argsort(-row, kind="stable")
        best = int(order[0])
        out.append(
            Prediction(
                label=labels[best],
                confidence=float(row[best]),
                probabilities={lab: float(p) for lab, p in zip(labels, row, strict=True)},
                alternatives=[(labels[int(i)], float(row[int(i)])) for i in order[1:]],
                head_version=version,
            )
        )
    return out


def head_predictions(
    head: EmbeddingHead,
    encoder: Encoder,
    texts: Sequence[str],
    version: str | None = None,
    *,
    early_encoder: Encoder | None = None,
    threshold: float = DEFAULT_THRESHOLD,
) -> list[Prediction]:
    """Predictions of `head`; with an early-exit head (and its encoder) the early head
    answers the texts it is sure of (confidence >= threshold) and the full encoder and
    head see only the rest."""
    texts = list(texts)
    batch = max(32, len(texts))  # the encoder chunks inside
    if head.early is None or early_encoder is None:
        return _predictions(head, encoder.encode(texts, batch_size=batch), texts, version)
    out = _predictions(head.early, early_encoder.encode(texts, batch_size=batch), texts,
                       version)
    unsure = [i for i, p in enumerate(out) if p.confidence < threshold]
    out = [p if p.confidence < threshold else msgspec.structs.replace(p, early_exit=True)
           for p in out]
    if unsure:
        rest = [texts[i] for i in unsure]
        full = _predictions(head, encoder.encode(rest, batch_size=batch), rest, version)
        for i, p in zip(unsure, full, strict=True):
            out[i] = p
    return out


def evaluate_head(
    head: EmbeddingHead, encoder: Encoder, texts: Sequence[str], labels: Sequence[str]
) -> dict[str, float]:
    early = head.early.make_encoder() if head.early is not None else None
    preds = head_predictions(head, encoder, texts, early_encoder=early)
    guess = [p.label for p in preds]
    acc = float(np.mean([g == t for g, t in zip(guess, labels, strict=True)]))
    return {"accuracy": acc, "macro_f1": macro_f1(labels, guess), "n": len(labels)}


# ---------------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------------
class PromotionResult(msgspec.Struct, frozen=True):
    promoted: bool
    reason: str
    candidate: dict[str, float]
    current: dict[str, float] | None
    version: str | None  # the candidate's version when promoted
    previous_version: str | None
    n_eval: int


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class HeadRegistry:
    """Versioned heads under `root`: v0001/, v0002/, ... and a CURRENT pointer.

    Only promoted candidates get a version directory; refused candidates are logged
    (metrics + shadow scores) in `root/rejected.jsonl`.
    """

    def __init__(self, root: Path, encoder: Encoder | None = None) -> None:
        self.root = Path(root)
        self._encoder = encoder
        self._lock = threading.Lock()
        self._loaded_version: str | None = None
        self._loaded_head: EmbeddingHead | None = None
        self._pointer_stamp: tuple[int, int] | None = None

    # -- reading --------------------------------------------------------------------
    @property
    def pointer(self) -> Path:
        return self.root / "CURRENT"

    def versions(self) -> list[str]:
        if not self.root.exists():
            return []
        return sorted(
            p.name
            for p in self.root.iterdir()
            if p.is_dir() and p.name.startswith(_VERSION_PREFIX) and p.name[1:].isdigit()
        )

    def _read_pointer(self) -> str | None:
        try:
            v = self.pointer.read_text().strip()
        except FileNotFoundError:
            return None
        return v or None

    @property
    def current_version(self) -> str | None:
        return self._read_pointer()

    def load_version(self, version: str) -> EmbeddingHead:
        return EmbeddingHead.load(self.root / version)

    def current(self) -> EmbeddingHead | None:
        version = self._read_pointer()
        if version is None:
            return None
        with self._lock:
            if version != self._loaded_version:
                self._loaded_head = self.load_version(version)
                self._loaded_version = version
                self._pointer_stamp = self._stamp()
            return self._loaded_head

    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = self.pointer.stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_ino)

    def maybe_reload(self) -> bool:
        """Cheap check (one stat) for a newly promoted head; load it if there is one."""
        stamp = self._stamp()
        if stamp == self._pointer_stamp and self._loaded_version is not None:
            return False
        version = self._read_pointer()
        self._pointer_stamp = stamp
        if version is None or version == self._loaded_version:
            return False
        head = self.load_version(version)
        with self._lock:
            self._loaded_head, self._loaded_version = head, version
        log.info("[classifier] loaded embedding head %s", version)
        return True

    @property
    def loaded_version(self) -> str | None:
        return self._loaded_version

    # -- writing --------------------------------------------------------------------
    def _encoder_for(self, head: EmbeddingHead) -> Encoder:
        if head.has_own_encoder:
            return head.make_encoder(threads=max(1, os.cpu_count() or 1))
        return self._encoder if self._encoder is not None else head.make_encoder()

    def add(self, head: EmbeddingHead) -> str:
        """Store `head` as the next version (not promoted)."""
        self.root.mkdir(parents=True, exist_ok=True)
        staging = self.root / f".staging-{os.getpid()}-{threading.get_ident()}-{time.time_ns()}"
        head.save(staging)
        while True:
            existing = self.versions()
            n = int(existing[-1][1:]) + 1 if existing else 1
            version = f"{_VERSION_PREFIX}{n:04d}"
            try:
                os.rename(staging, self.root / version)  # atomic; fails if taken
                return version
            except OSError:
                if not (self.root / version).exists():
                    raise

    def set_current(self, version: str) -> None:
        if not (self.root / version / "head.json").exists():
            raise FileNotFoundError(f"no head {version} under {self.root}")
        _atomic_write(self.pointer, version + "\n")

    def propose(
        self,
        head: EmbeddingHead,
        eval_texts: Sequence[str],
        eval_labels: Sequence[str],
        *,
        tolerance: float = 0.0,
    ) -> PromotionResult:
        """Shadow-evaluate `head` against the current head on the same held-out lines.

        Promote when macro-F1 >= current - tolerance and accuracy >= current.
        """
        eval_texts, eval_labels = list(eval_texts), [str(x) for x in eval_labels]
        if not eval_texts:
            raise ValueError("shadow evaluation needs held-out lines")
        cand = evaluate_head(head, self._encoder_for(head), eval_texts, eval_labels)
        previous = self._read_pointer()
        cur_head = self.current() if previous else None
        cur = (
            evaluate_head(cur_head, self._encoder_for(cur_head), eval_texts, eval_labels)
            if cur_head is not None
            else None
        )
        if cur is None:
            ok, reason = True, "no current head"
        elif (
            cand["macro_f1"] >= cur["macro_f1"] - tolerance
            and cand["accuracy"] >= cur["accuracy"]
        ):
            ok, reason = True, "candidate not worse than current"
        else:
            ok = False
            reason = (
                f"candidate worse: macro_f1 {cand['macro_f1']:.4f} vs {cur['macro_f1']:.4f}, "
                f"accuracy {cand['accuracy']:.4f} vs {cur['accuracy']:.4f}"
            )
        version: str | None = None
        head.metrics["shadow_eval"] = {"candidate": cand, "current": cur, "against": previous}
        if ok:
            version = self.add(head)
            self.set_current(version)
            log.info("[classifier] promoted head %s (%s)", version, reason)
        else:
            self.root.mkdir(parents=True, exist_ok=True)
            with open(self.root / "rejected.jsonl", "a") as f:
                f.write(json.dumps({"at": time.time(), "reason": reason,
                                    "metrics": head.metrics}, default=str) + "\n")
            log.info("[classifier] refused candidate head: %s", reason)
        return PromotionResult(
            promoted=ok,
            reason=reason,
            candidate=cand,
            current=cur,
            version=version,
            previous_version=previous,
            n_eval=len(eval_texts),
        )


# ---------------------------------------------------------------------------------
# classifier
# ---------------------------------------------------------------------------------
class Layer2Classifier:
    """Encoder + head. Give it a head, or a registry (hot-reloadable), or both.

    When the head carries a fine-tuned encoder that encoder is used; otherwise the
    given encoder (default: the shared FastEncoder for the head's base model). A head
    with an early exit also gets `early_encoder` (default: its shallow FastEncoder).
    """

    def __init__(
        self,
        head: EmbeddingHead | None = None,
        encoder: Encoder | None = None,
        *,
        registry: HeadRegistry | None = None,
        threshold: float = DEFAULT_THRESHOLD,
        early_encoder: Encoder | None = None,
    ) -> None:
        self.registry = registry
        self.threshold = threshold
        self._base_encoder = encoder
        self._early_encoder = early_encoder
        self.version: str | None = None
        if head is None and registry is not None:
            head = registry.current()
            self.version = registry.loaded_version
        if head is None:
            raise ValueError("Layer2Classifier needs a head (none given, registry empty)")
        self._state = (head, self._encoder_for(head), self._early_encoder_for(head),
                       self.version)

    @classmethod
    def from_registry(
        cls, root: Path, encoder: Encoder | None = None, **kw: Any
    ) -> Layer2Classifier:
        return cls(registry=HeadRegistry(root, encoder=encoder), encoder=encoder, **kw)

    def _encoder_for(self, head: EmbeddingHead) -> Encoder:
        if head.has_own_encoder:
            return head.make_encoder()
        # A given encoder serves every head; otherwise each head gets the shared encoder
        # of its own model and precision (a hot-reloaded head may change precision).
        return self._base_encoder if self._base_encoder is not None else head.make_encoder()

    def _early_encoder_for(self, head: EmbeddingHead) -> Encoder | None:
        if head.early is None:
            return None
        if self._early_encoder is not None:
            return self._early_encoder
        return head.early.make_encoder()

    @property
    def head(self) -> EmbeddingHead:
        return self._state[0]

    @property
    def encoder(self) -> Encoder:
        return self._state[1]

    @property
    def labels(self) -> list[str]:
        return self.head.labels

    def maybe_reload(self) -> bool:
        """Swap in a newly promoted head (cheap when nothing changed)."""
        if self.registry is None or not self.registry.maybe_reload():
            return False
        head = self.registry.current()
        if head is None:
            return False
        encoder, early = self._encoder_for(head), self._early_encoder_for(head)
        self.version = self.registry.loaded_version
        self._state = (head, encoder, early, self.version)  # one atomic swap
        return True

    def classify(self, text: str) -> Prediction:
        return self.classify_batch([text])[0]

    def classify_batch(self, texts: Sequence[str]) -> list[Prediction]:
        if not texts:
            return []
        head, encoder, early, version = self._state
        return head_predictions(head, encoder, texts, version, early_encoder=early,
                                threshold=self.threshold)

    def decides(self, prediction: Prediction, threshold: float | None = None) -> bool:
        return decides(prediction, self.threshold if threshold is None else threshold)


# ---------------------------------------------------------------------------------
# micro-batching
# ---------------------------------------------------------------------------------
class MicroBatcher:
    """`await submit(text)`: concurrent submissions are classified in one batch.

    A batch closes when `max_batch` texts are queued or `max_wait_ms` has passed
    since its first text. The encoder runs in one dedicated worker thread, so the
    event loop never blocks and batches never overlap; while a batch runs, new
    submissions queue up and form the next one.
    """

    def __init__(
        self,
        classifier: Layer2Classifier,
        *,
        max_batch: int = 32,
        max_wait_ms: float = 2.0,
    ) -> None:
        self.classifier = classifier
        self.max_batch = max(1, max_batch)
        self.max_wait = max(0.0, max_wait_ms) / 1000.0
        self._queue: asyncio.Queue[tuple[str, asyncio.Future[Prediction]] | None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="layer2-encoder"
        )
        self._closed = False
        self.batches = 0
        self.items = 0
        self.max_batch_seen = 0

    def _ensure_started(self) -> None:
        if self._task is None:
            self._queue = asyncio.Queue()
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def submit(self, text: str) -> Prediction:
        if self._closed:
            raise RuntimeError("MicroBatcher is closed")
        self._ensure_started()
        assert self._queue is not None
        fut: asyncio.Future[Prediction] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((text, fut))
        return await fut

    async def _run(self) -> None:
        assert self._queue is not None
        queue, loop = self._queue, asyncio.get_running_loop()
        stop = False
        while not stop:
            first = await queue.get()
            if first is None:
                break
            batch = [first]
            deadline = loop.time() + self.max_wait
            while len(batch) < self.max_batch:
                try:
                    item = queue.get_nowait()
                except asyncio.QueueEmpty:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        break
                    try:
                        item = await asyncio.wait_for(queue.get(), remaining)
                    except TimeoutError:
                        break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            live = [(t, f) for t, f in batch if not f.done()]
            if not live:
                continue
            texts = [t for t, _ in live]
            try:
                preds = await loop.run_in_executor(
                    self._executor, self.classifier.classify_batch, texts
                )
            except Exception as exc:  # every caller of the batch sees the failure
                for _, f in live:
                    if not f.done():
                        f.set_exception(exc)
                continue
            self.batches += 1
            self.items += len(live)
            self.max_batch_seen = max(self.max_batch_seen, len(live))
            for (_, f), p in zip(live, preds, strict=True):
                if not f.done():
                    f.set_result(p)

    async def maybe_reload(self) -> bool:
        """`classifier.maybe_reload()` on the encoder thread: loading a new head (and a
        fine-tuned encoder, which may need an ONNX export) never blocks the event loop,
        and the swap happens between batches."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.classifier.maybe_reload)

    async def close(self) -> None:
        """Stop accepting; classify everything already submitted; stop the thread."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None and self._queue is not None:
            self._queue.put_nowait(None)
            await self._task
            # Anything queued behind the sentinel (submitted concurrently) is drained too.
            rest = []
            while not self._queue.empty():
                item = self._queue.get_nowait()
                if item is not None:
                    rest.append(item)
            if rest:
                loop = asyncio.get_running_loop()
                preds = await loop.run_in_executor(
                    self._executor, self.classifier.classify_batch, [t for t, _ in rest]
                )
                for (_, f), p in zip(rest, preds, strict=True):
                    if not f.done():
                        f.set_result(p)
        self._executor.shutdown(wait=True)
