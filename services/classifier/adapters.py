"""Adapters for the cascade's model layers: Layer 2 (encoder + head, micro-batched,
hot-reloaded) and Layer 3 (Ollama)."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from services.classifier.cascade import Layer2
from services.classifier.embedding import Layer2Classifier, MicroBatcher, Prediction
from services.classifier.llm import LlmLabeler, OllamaLabeler
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

    async def predict_many(self, texts: list[str]) -> list[Prediction]:
        return list(await asyncio.gather(*(self.batcher.submit(t) for t in texts)))

    async def close(self) -> None:
        await self.batcher.close()


def build_layer2(settings: ClassifierSettings) -> BatchedLayer2 | None:
    if not settings.heads_dir or not Path(settings.heads_dir).exists():
        log.warning("[classify] no Layer 2 heads at %r: embedding layer off", settings.heads_dir)
        return None
    from shared.embeddings import pin_threads

    pin_threads(1)
    classifier = Layer2Classifier.from_registry(Path(settings.heads_dir),
                                                threshold=settings.threshold)
    return BatchedLayer2(classifier, max_batch=settings.micro_batch,
                         max_wait_ms=settings.micro_batch_wait_ms)


def build_llm(settings: ClassifierSettings) -> LlmLabeler | None:
    if not (settings.ollama_host and settings.llm_model):
        return None
    return OllamaLabeler(settings.ollama_host, settings.llm_model, timeout=settings.llm_timeout)


__all__ = ["BatchedLayer2", "Layer2", "build_layer2", "build_llm"]
