"""Adapters for the cascade's model layers: Layer 2 (encoder + head, micro-batched,
hot-reloaded) and Layer 3 (the model server the settings name: `shared.llm`)."""

from __future__ import annotations

import logging
import time
from typing import Any

from services.classifier.layer2.batcher import MicroBatcher
from services.classifier.layer2.classifier import Layer2Classifier
from services.classifier.layer2.predict import Prediction
from services.classifier.layer2.registry import seed_registry
from services.classifier.layer3 import ModelLabeler
from services.classifier.ports import LlmLabeler
from services.classifier.settings import ClassifierSettings

log = logging.getLogger("intentroute.classifier")


class BatchedLayer2:
    """One encoder per worker; concurrent messages are encoded together."""

    def __init__(self, classifier: Layer2Classifier, *, max_batch: int, max_wait_ms: float,
                 reload_every: float = 1.0) -> None:
        self.classifier = classifier
        self.batcher = MicroBatcher(classifier, max_batch=max_batch, max_wait_ms=max_wait_ms)
        self._reload_every = reload_every
        self._checked = time.monotonic()

    async def _maybe_reload(self) -> None:
        # A promoted head is picked up without a restart. The check is a stat call; a
        # reload runs on the encoder thread (a fine-tuned head may export its model).
        now = time.monotonic()
        if now - self._checked >= self._reload_every:
            self._checked = now
            if await self.batcher.maybe_reload():
                log.info("[classify] promoted head %s loaded", self.classifier.version)

    async def predict(self, text: str) -> Prediction:
        await self._maybe_reload()
        return await self.batcher.submit(text)

    async def close(self) -> None:
        await self.batcher.close()


def build_classifier(
    settings: ClassifierSettings, *, threshold: float | None = None
) -> Layer2Classifier | None:
    """Layer 2 as configured: the current head of the registry (seeded with the shipped
    head when it has none) and its encoders; None when the registry is "" (Layer 2 off).
    """
    root = settings.heads_root
    if root is None:
        log.warning("[classify] CLASSIFIER_HEADS_DIR is empty: embedding layer off")
        return None
    seed_registry(root)
    from shared.encoders.embeddings import pin_threads

    pin_threads(1)
    return Layer2Classifier.from_registry(
        root,
        threshold=settings.threshold if threshold is None else threshold,
        default_precision=settings.common.encoder_precision,
        onnx_cache_dir=settings.common.onnx_cache_dir,
    )


def build_layer2(settings: ClassifierSettings) -> BatchedLayer2 | None:
    classifier = build_classifier(settings)
    if classifier is None:
        return None
    return BatchedLayer2(classifier, max_batch=settings.micro_batch,
                         max_wait_ms=settings.micro_batch_wait_ms)


def build_llm(settings: ClassifierSettings, nc: Any = None) -> LlmLabeler | None:
    """Layer 3 on its chain of fleet models (shared.llm.select.label_chain), the shared
    circuits on `nc` when given; None without a model server or a model."""
    from shared.llm.select import label_chain, open_walker

    walker, _ = open_walker(settings.common, nc, timeout=settings.llm_timeout)
    refs = label_chain(walker.fleet, settings.common, "classifier", settings.llm_model)
    if not refs:
        return None
    return ModelLabeler(walker, refs, timeout=settings.llm_timeout)


__all__ = ["BatchedLayer2", "build_classifier", "build_layer2", "build_llm"]
