"""A head's predictions, with the early exit: a head on a shallow encoder answers the
texts it is sure of; only the rest pay for the full encoder and head."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from services.classifier.layer2.head import EmbeddingHead
from shared.encoders.embeddings import Encoder
from shared.policy.clarity import DECIDE_THRESHOLD


class Prediction(msgspec.Struct, frozen=True):
    label: str
    confidence: float
    probabilities: dict[str, float]
    # Every other label, best first: (label, probability).
    alternatives: list[tuple[str, float]]
    head_version: str | None = None
    # Decided by the head's early exit (the shallow encoder) alone.
    early_exit: bool = False
    # The sentence vector of the first encoder that read the text (the early exit's when
    # the head has one, else the full encoder's): the answer cache matches on it
    # (services.classifier.answer_cache) instead of encoding the message again.
    vector: Any = None


def _predictions(
    head: EmbeddingHead, vectors: np.ndarray, texts: Sequence[str], version: str | None,
    first: np.ndarray | None = None,
) -> list[Prediction]:
    probs = head.predict_proba(vectors, texts)
    out: list[Prediction] = []
    labels = head.labels
    first = vectors if first is None else first
    for i, row in enumerate(probs):
        order = np.argsort(-row, kind="stable")
        best = int(order[0])
        out.append(
            Prediction(
                label=labels[best],
                confidence=float(row[best]),
                probabilities={lab: float(p) for lab, p in zip(labels, row, strict=True)},
                alternatives=[(labels[int(i)], float(row[int(i)])) for i in order[1:]],
                head_version=version,
                vector=first[i],
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
    threshold: float = DECIDE_THRESHOLD,
) -> list[Prediction]:
    """Predictions of `head`; with an early-exit head (and its encoder) the early head
    answers the texts it is sure of (confidence >= threshold) and the full encoder and
    head see only the rest."""
    texts = list(texts)
    batch = max(32, len(texts))  # the encoder chunks inside
    if head.early is None or early_encoder is None:
        return _predictions(head, encoder.encode(texts, batch_size=batch), texts, version)
    early = early_encoder.encode(texts, batch_size=batch)
    out = _predictions(head.early, early, texts, version)
    unsure = [i for i, p in enumerate(out) if p.confidence < threshold]
    out = [p if p.confidence < threshold else msgspec.structs.replace(p, early_exit=True)
           for p in out]
    if unsure:
        rest = [texts[i] for i in unsure]
        full = _predictions(head, encoder.encode(rest, batch_size=batch), rest, version,
                            first=early[unsure])
        for i, p in zip(unsure, full, strict=True):
            out[i] = p
    return out
