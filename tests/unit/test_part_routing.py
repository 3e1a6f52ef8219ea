"""A message's parts routed by the cascade (services/classifier/part_routing.py): all at
once, yet each part that reads the history sees the parts before it, as in turn."""

from __future__ import annotations

import asyncio
from typing import Any

from services.classifier.cascade import Cascade
from services.classifier.part_routing import route_parts
from shared.contracts.request import AgentRequest
from shared.contracts.routing import HistoryEntry, QueryType
from testkit.fakes import KeywordLayer2

THREE = ("explain addVar, then write an endpoint that returns a total; also, can you "
         "send me my last invoice?")


def request(query: str) -> AgentRequest:
    return AgentRequest(request_id="r", session_id="s", agent_id="a", query=query,
                        extra_context="invoice 2026-10: 12.40 EUR")


class Gathering(KeywordLayer2):
    """Layer 2 that answers only once `n` texts wait at once (or after a second)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n, self.waiting, self.most = n, 0, 0
        self.all_in = asyncio.Event()

    async def predict(self, text: str) -> Any:
        self.waiting += 1
        self.most = max(self.most, self.waiting)
        if self.waiting >= self.n:
            self.all_in.set()
        try:
            await asyncio.wait_for(self.all_in.wait(), 1.0)
        except TimeoutError:
            pass
        finally:
            self.waiting -= 1
        return await super().predict(text)


async def test_the_parts_are_decided_at_once() -> None:
    layer2 = Gathering(3)
    plans = await route_parts(Cascade(layer2=layer2), request(THREE), _no_history,
                              trusted=False, confirm=None)
    assert [p.decision.type for p in plans] == [
        QueryType.RETRIEVAL, QueryType.CODE_GENERATION, QueryType.PLATFORM]
    assert layer2.most == 3  # one batch for the encoder, not three in turn


async def test_a_part_that_reads_the_history_sees_the_parts_before_it() -> None:
    seen: list[list[str]] = []
    reads = 0

    async def history() -> list[HistoryEntry]:
        nonlocal reads
        reads += 1
        await asyncio.sleep(0)
        return [HistoryEntry(QueryType.PLATFORM, "mi cuota")]

    class Recording(Cascade):
        async def decide(self, request: Any, history: Any, **kw: Any) -> Any:
            seen.append([h.topic for h in await history()])
            return await super().decide(request, history, **kw)

    await route_parts(Recording(layer2=KeywordLayer2()),
                      request("¿qué hace startLoop? ¿y endLoop?"), history, trusted=False,
                      confirm=None)
    assert sorted(seen, key=len) == [["mi cuota"], ["mi cuota", "¿qué hace startLoop?"]]
    assert reads == 1  # the session's history read once for every part


async def _no_history() -> list[HistoryEntry]:
    return []
