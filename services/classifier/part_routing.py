"""A message's parts, routed (issue 34): the splitter's cut (split.py), each part
decided by the cascade with the intent history extended by the parts before it (as
`eval multi` measures it; the parts are decided concurrently, a part that reads the
history waiting for those before it), and neighbouring parts of one type answered as
one (a cut between two requests of one kind costs nothing to undo and was most of the
single messages wrongly cut: 0.35% / 0% / 0.8% of the routing sets stay cut).

Pure over the cascade: no I/O of its own."""

from __future__ import annotations

import asyncio
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
    merge into one). The parts are decided at once (Layer 2 encodes them in one batch);
    a part whose decision reads the history (a deictic part, Layer 3) waits there for
    the parts before it, so it sees what a decision in turn would."""
    cut = split(req.query)
    if not cut.multi:
        return []
    known: asyncio.Task[list[HistoryEntry]] | None = None

    async def read() -> list[HistoryEntry]:
        nonlocal known
        if known is None:  # one store read, however many parts ask
            known = asyncio.ensure_future(history())
        return await known

    decided: list[asyncio.Future[RoutingDecision]] = []
    for i, part in enumerate(cut.parts):
        decided.append(asyncio.ensure_future(_decide(
            cascade, msgspec.structs.replace(req, query=part.standalone, query_type=None),
            read, list(zip(cut.parts[:i], decided[:i], strict=True)),
            trusted=trusted, confirm=confirm)))
    try:
        decisions = await asyncio.gather(*decided)
    finally:
        for task in decided:
            task.cancel()  # a failure leaves no part deciding on its own
        if known is not None:
            known.cancel()
    merged = _merge(req.query, list(zip(cut.parts, decisions, strict=True)))
    if len(merged) < 2:
        return []
    return [PartPlan(text=text, decision=decision, refers_to=refers)
            for text, decision, refers in merged]


async def _decide(cascade: Cascade, asked: AgentRequest, read: History,
                  before: list[tuple[Part, asyncio.Future[RoutingDecision]]], *,
                  trusted: bool, confirm: float | None) -> RoutingDecision:
    """One part's decision; its history is the session's and the parts before it."""

    async def with_parts() -> list[HistoryEntry]:
        earlier = [HistoryEntry((await decision).type, topic_snippet(part.query))
                   for part, decision in before]
        return [*(await read()), *earlier][-HISTORY_WINDOW:]

    return await cascade.decide(asked, with_parts, trusted=trusted, confirm=confirm)


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
