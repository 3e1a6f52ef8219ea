"""Layer 2 as the answer cache needs it: every message's sentence vector, computed once.

`RememberingLayer2` is the cascade's Layer 2 (it delegates `predict`) and keeps the
vector each prediction carries (`Prediction.vector`: the first encoder's, which Layer 2
computes for every message it reads) for the few messages in flight, so the cache looks
up the vector Layer 2 made instead of encoding the message again. A message Layer 2
never read (decided by a rule, a declared type) is encoded here once; with the shipped
head that is the encoder's embedding module alone, a table lookup (~0.05 ms) done on
the event loop, otherwise one prediction on the encoder thread.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from services.classifier.adapters import BatchedLayer2
    from services.classifier.layer2.predict import Prediction
    from shared.encoders.embeddings import Encoder

Vector = npt.NDArray[np.float32]


class RememberingLayer2:
    """Layer 2 (`services.classifier.ports.Layer2`) that remembers its last vectors."""

    def __init__(self, inner: BatchedLayer2, *, keep: int = 1024) -> None:
        self.inner = inner
        self._keep = keep
        self._seen: OrderedDict[str, Vector] = OrderedDict()

    async def predict(self, text: str) -> Prediction:
        prediction = await self.inner.predict(text)
        if prediction.vector is not None:
            self._seen[text] = prediction.vector
            self._seen.move_to_end(text)
            while len(self._seen) > self._keep:
                self._seen.popitem(last=False)
        return prediction

    @property
    def encoder(self) -> Encoder:
        """The encoder every prediction's vector comes from (changes when a promoted
        head brings another one)."""
        return self.inner.classifier.first_encoder

    @property
    def layers(self) -> Any:
        return getattr(self.encoder, "layers", None)

    async def vector(self, text: str) -> Vector:
        """The message's vector: Layer 2's if it read the message, else computed once."""
        seen = self._seen.get(text)
        if seen is not None:
            return seen
        if self.layers == 0:  # a table lookup: cheaper than any hand-off
            return np.asarray(self.encoder.encode([text], batch_size=1)[0], dtype=np.float32)
        prediction = await self.predict(text)
        return np.asarray(prediction.vector, dtype=np.float32)

    async def encode(self, texts: Sequence[str]) -> Vector:
        """Many questions' vectors (the cache's stored questions), off the event loop."""
        encoder = self.encoder
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.asarray(await asyncio.to_thread(encoder.encode, list(texts), 32),
                          dtype=np.float32)

    async def close(self) -> None:
        await self.inner.close()
