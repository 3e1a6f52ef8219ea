"""`Layer2Classifier`: the encoder(s) and the current head, hot-swappable."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from services.classifier.layer2.head import EmbeddingHead
from services.classifier.layer2.predict import Prediction, head_predictions
from services.classifier.layer2.registry import HeadRegistry
from shared.encoders.embeddings import Encoder
from shared.policy.clarity import DECIDE_THRESHOLD


class Layer2Classifier:
    """Encoder + head. Give it a head, or a registry (hot-reloadable), or both.

    When the head carries a fine-tuned encoder that encoder is used; otherwise the
    given encoder (default: the shared FastEncoder for the head's base model). A head
    with an early exit also gets `early_encoder` (default: its shallow FastEncoder).
    Encoders built here take the head's precision, `default_precision` for a head
    that names none, and cache exported ONNX graphs in `onnx_cache_dir`.
    """

    def __init__(
        self,
        head: EmbeddingHead | None = None,
        encoder: Encoder | None = None,
        *,
        registry: HeadRegistry | None = None,
        threshold: float = DECIDE_THRESHOLD,
        early_encoder: Encoder | None = None,
        default_precision: str = "fp32",
        onnx_cache_dir: Path | None = None,
    ) -> None:
        self.registry = registry
        self.threshold = threshold
        self._base_encoder = encoder
        self._early_encoder = early_encoder
        self._default_precision = default_precision
        self._onnx_cache_dir = onnx_cache_dir
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
        return cls(registry=HeadRegistry(root), encoder=encoder, **kw)

    def _make(self, head: EmbeddingHead) -> Encoder:
        return head.make_encoder(default_precision=self._default_precision,
                                 onnx_cache_dir=self._onnx_cache_dir)

    def _encoder_for(self, head: EmbeddingHead) -> Encoder:
        if head.has_own_encoder:
            return self._make(head)
        # A given encoder serves every head; otherwise each head gets the shared encoder
        # of its own model and precision (a hot-reloaded head may change precision).
        return self._base_encoder if self._base_encoder is not None else self._make(head)

    def _early_encoder_for(self, head: EmbeddingHead) -> Encoder | None:
        if head.early is None:
            return None
        if self._early_encoder is not None:
            return self._early_encoder
        return self._make(head.early)

    @property
    def encoder(self) -> Encoder:
        return self._state[1]

    @property
    def first_encoder(self) -> Encoder:
        """The encoder that reads every text first (the early exit's, else the full
        one): the one whose vector each prediction carries (`Prediction.vector`)."""
        _, encoder, early, _ = self._state
        return early if early is not None else encoder

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
