"""`EmbeddingHead`: a calibrated linear head over sentence vectors (+ char n-grams).

p = softmax((x @ coef.T + intercept) / temperature), x the L2-normalised sentence vector
followed (when the head has a lexical block) by the text's hashed char n-grams. The
temperature is fitted offline on held-out logits, so `max(p)` is a calibrated confidence.

Stored as .npy coefficients + JSON (no pickle). A head trained on a fine-tuned encoder
carries the encoder weights in `dir/encoder/`; a head with an early exit carries that
second head in `dir/early/`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from services.classifier.layer2.features import LexicalFeatures
from shared.encoders.embeddings import DEFAULT_MODEL, Encoder

HEAD_FORMAT = 1
EARLY_DIR = "early"  # the early-exit head's subdirectory in a head directory


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax (a new array; `logits` is left as it is)."""
    z: np.ndarray = logits - logits.max(axis=1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=1, keepdims=True)
    return z


class EmbeddingHead:
    """Calibrated linear head; see the module doc."""

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
        # None: the serving process's default. Serving with the same keeps train and
        # serve alike.
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

    def make_encoder(
        self,
        *,
        threads: int = 1,
        default_precision: str = "fp32",
        onnx_cache_dir: Path | None = None,
    ) -> Encoder:
        """The encoder this head expects (fast path; fine-tuned weights if any), at the
        precision its training vectors had (`default_precision` when it names none)."""
        from shared.encoders.fast import FastEncoder, shared_fast_encoder

        if self.encoder_dir is not None:
            # A fine-tuned encoder's head is trained on that encoder's fp32 vectors.
            return FastEncoder(self.encoder_dir, threads=threads, layers=self.layers,
                               precision=self.precision or "fp32",
                               onnx_cache_dir=onnx_cache_dir)
        return shared_fast_encoder(self.encoder, threads=threads,
                                   precision=self.precision or default_precision,
                                   layers=self.layers, onnx_cache_dir=onnx_cache_dir)

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
