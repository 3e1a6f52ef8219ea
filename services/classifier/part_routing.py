"""A message's parts, routed (issue 34): the splitter's cut (split.py), each part
decided by the cascade with the intent history extended by the parts before it (as
`eval multi` measures it), and neighbouring parts of one type answered as one (a cut
between two requests of one kind costs nothing to undo and was most of the single
messages wrongly cut: 0.35% / 0% / 0.8% of the routing sets stay cut).

Pure over the cascade: no I/O of its own."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec

from services.classifier.cascade import Cascade
from services.classifier.split import Part, split
from shared.contracts.pipeline import PartPlan
from shared.contracts.request import AgentRequest
from shared.contracts.routing import (
    HISTORY_WINDOW,
    HistoryEntry,
    RoutingDecision,
    topic_snippet,
)

History = Callable[[], Awaitable[list[HistoryEntry]]]


async def route_parts(cascade: Cascade, req: AgentRequest, history: History, *,
                      trusted: bool, confirm: float | None) -> list[PartPlan]:
    """The message's requests, routed, in order; [] when it carries one (or its parts
    merge into one)."""
    cut = split(req.query)
    if not cut.multi:
        return []
    known: list[HistoryEntry] | None = None

    async def read() -> list[HistoryEntry]:
        nonlocal known
        if known is None:
            known = await history()
        return known

    plans: list[tuple[Part, RoutingDecision]] = []
    before: list[HistoryEntry] = []
    for part in cut.parts:
        asked = msgspec.structs.replace(req, query=part.standalone, query_type=None)

        async def with_parts(extra: list[HistoryEntry] = before) -> list[HistoryEntry]:
            return [*(await read()), *extra][-HISTORY_WINDOW:]

        decision = await cascade.decide(asked, with_parts, trusted=trusted, confirm=confirm)
        plans.append((part, decision))
        before = [*before, HistoryEntry(decision.type, topic_snippet(part.query))]
    merged = _merge(req.query, plans)
    if len(merged) < 2:
        return []
    return [PartPlan(text=text, decision=decision, refers_to=refers)
            for text, decision, refers in merged]


def _merge(message: str, plans: list[tuple[Part, RoutingDecision]]
           ) -> list[tuple[str, RoutingDecision, int]]:
    """Neighbouring parts routed to one type (and slot) answered as one: the message's
    text from the first one's start to the last one's end."""
    out: list[tuple[str, RoutingDecision, int, int, int]] = []  # text, dec, refers, s, e
    for part, dec in plans:
        if out and out[-1][1].type == dec.type and out[-1][1].model_slot == dec.model_slot:
            _, first, refers, start, _ = out[-1]
            out[-1] = (message[start:part.end].strip(), first, refers, start, part.end)
            continue
        refers = -1 if part.refers_to is None else part.refers_to
        out.append((part.standalone, dec, refers, part.start, part.end))
    return [(text, dec, refers) for text, dec, refers, _, _ in out]
