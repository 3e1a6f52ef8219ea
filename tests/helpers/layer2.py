"""A hand-written Layer 2 (encoder + head) for cascade tests: a keyword table, each
keyword read as one type with a fixed confidence, the rest spread over the others."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.contracts.routing import QueryType


@dataclass(frozen=True)
class Pred:
    label: str
    confidence: float
    alternatives: list[tuple[str, float]] = field(default_factory=list)


class FakeLayer2:
    """Keyword table standing in for the encoder + head."""

    def __init__(self, table: dict[str, tuple[QueryType, float]],
                 default: tuple[QueryType, float] = (QueryType.RETRIEVAL, 0.5)) -> None:
        self.table = table
        self.default = default
        self.seen: list[str] = []

    async def predict(self, text: str) -> Pred:
        self.seen.append(text)
        for key, (qt, conf) in self.table.items():
            if key in text.lower():
                others = [(t.value, round((1 - conf) / 3, 3)) for t in QueryType if t != qt]
                return Pred(qt.value, conf, others)
        qt, conf = self.default
        return Pred(qt.value, conf, [(t.value, (1 - conf) / 3) for t in QueryType if t != qt])


TABLE = {
    "addvar": (QueryType.RETRIEVAL, 0.97),
    "write": (QueryType.CODE_GENERATION, 0.96),
    "endpoint": (QueryType.CODE_GENERATION, 0.95),
    "invoice": (QueryType.PLATFORM, 0.93),
    "summary": (QueryType.CONVERSATIONAL, 0.9),
    "maybe": (QueryType.RETRIEVAL, 0.7),
    "hmm": (QueryType.RETRIEVAL, 0.4),
}
