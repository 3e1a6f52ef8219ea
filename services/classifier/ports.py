"""The Protocols this service's handlers depend on; adapters implement them, tests pass fakes."""

from __future__ import annotations

from typing import Protocol

from shared.contracts.routing import HistoryEntry, QueryType


class Prediction(Protocol):
    @property
    def label(self) -> str: ...

    @property
    def confidence(self) -> float: ...

    @property
    def alternatives(self) -> list[tuple[str, float]]: ...


class Layer2(Protocol):
    """Embedding classifier (micro-batched in the worker)."""

    async def predict(self, text: str) -> Prediction: ...


class LlmLabeler(Protocol):
    async def label(
        self, query: str, history: list[HistoryEntry], editor_context: str
    ) -> QueryType | None: ...
