"""Several sentence encoders side by side: one vector per text, their unit vectors
concatenated and scaled by 1/sqrt(k) so the row stays unit length.

`eval intents` uses it for MiniLM + mpnet (docs/explanation/encoders.md, "Encoders", says
what it gains and costs); its name is the members' names joined by "+"."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shared.encoders.embeddings import Encoder, Vectors

SEPARATOR = "+"


class ConcatEncoder:
    """`Encoder` protocol over `members` (each returning L2-normalised rows)."""

    def __init__(self, members: Sequence[Encoder], names: Sequence[str]) -> None:
        if not members or len(members) != len(names):
            raise ValueError("one name per member encoder, at least one")
        self.members = list(members)
        self.model_name = SEPARATOR.join(names)

    @property
    def dim(self) -> int:
        return sum(m.dim for m in self.members)

    def encode(self, texts: list[str], batch_size: int = 32) -> Vectors:
        parts = [m.encode(texts, batch_size=batch_size) for m in self.members]
        out: Vectors = (np.hstack(parts) / np.sqrt(len(parts))).astype(np.float32)
        return out
