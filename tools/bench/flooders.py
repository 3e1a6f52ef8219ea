"""Flooding agents in a process of their own, for `bench fairness`.

The victims' latency is measured by the bench's process; when the same process also
published the floods and decoded every one of their answer chunks, its own event loop
was part of what the victims waited for (their p50 from the final's row to the bench
seeing it grew from ~4 ms quiet to 13 to 50 ms under five floods). Here the flooders
publish and count their answers in a child process, each on its own connection and
answer subjects, as separate clients would.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter, defaultdict
from typing import Any

import nats
from nats.aio.msg import Msg

from shared.client.caller import publish_until_stored
from shared.contracts.codec import decode_chunk
from shared.contracts.request import AgentRequest

QUESTIONS = ("What does addParam do?", "How do I loop from 1 to 10 in AVAP?",
             "what is addResult for", "how do I read a request header")
# Publishes in flight at once per connection: as fast as one connection goes.
STEP = 250


def request(agent: str, i: int) -> AgentRequest:
    """The bench's RETRIEVAL question `i` of `agent` (20 sessions per agent)."""
    return AgentRequest(request_id=uuid.uuid4().hex, session_id=f"{agent}-{i % 20}",
                        agent_id=agent, query=QUESTIONS[i % len(QUESTIONS)],
                        query_type="RETRIEVAL")


class Finals:
    """Final chunks as seen live: per request, the first's arrival (monotonic) and error
    code ("" for an answer), and every distinct final (two: a duplicate)."""

    def __init__(self) -> None:
        self.first: dict[str, tuple[float, str]] = {}
        self.distinct: dict[str, set[bytes]] = defaultdict(set)
        self.arrived = asyncio.Event()

    async def on_chunk(self, msg: Msg) -> None:
        try:
            chunk = decode_chunk(msg.data)
        except Exception:  # not a chunk
            return
        if not chunk.is_final:
            return
        self.distinct[chunk.request_id].add(msg.data)
        if chunk.request_id not in self.first:
            self.first[chunk.request_id] = (time.monotonic(),
                                            chunk.error.code if chunk.error else "")
            self.arrived.set()


class _Agent:
    def __init__(self, agent: str) -> None:
        self.agent = agent
        self.sent: set[str] = set()
        self.finals = Finals()

    def done(self) -> bool:
        return all(rid in self.finals.first for rid in self.sent)

    def report(self) -> dict[str, Any]:
        codes = {rid: self.finals.first[rid][1] for rid in self.sent
                 if rid in self.finals.first}
        return {"sent": len(self.sent),
                "answered": sum(1 for code in codes.values() if not code),
                "refused": dict(Counter(code for code in codes.values() if code)),
                "lost": len(self.sent) - len(codes),
                "duplicate_finals": sum(1 for rid in self.sent
                                        if len(self.finals.distinct.get(rid, ())) > 1)}


async def _flood(url: str, agents: list[tuple[str, dict[str, Any]]], count: int,
                 deadline: float) -> dict[str, Any]:
    conns, states = [], [_Agent(agent) for agent, _ in agents]
    try:
        for (agent, creds), state in zip(agents, states, strict=True):
            nc = await nats.connect(url, **creds)
            conns.append(nc)
            await nc.subscribe(f"agent.response.{agent}.*", cb=state.finals.on_chunk)
            await nc.flush()
        started = time.monotonic()

        async def one(nc: Any, state: _Agent, i: int) -> None:
            req = request(state.agent, i)
            state.sent.add(req.request_id)
            with contextlib.suppress(Exception):  # never stored: counted as lost
                await publish_until_stored(nc, req, give_up_at=time.monotonic() + 30)

        async def publish_all(nc: Any, state: _Agent) -> None:
            for start in range(0, count, STEP):
                await asyncio.gather(*(one(nc, state, i)
                                       for i in range(start, min(count, start + STEP))))

        await asyncio.gather(*(publish_all(nc, state)
                               for nc, state in zip(conns, states, strict=True)))
        give_up = started + deadline
        for state in states:
            while not state.done() and time.monotonic() < give_up:
                state.finals.arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(state.finals.arrived.wait(), 1.0)
        seconds = time.monotonic() - started
        await asyncio.sleep(1.0)  # a late duplicate
    finally:
        for nc in conns:
            with contextlib.suppress(Exception):
                await nc.close()
    return {"seconds": seconds, "agents": {s.agent: s.report() for s in states}}


def flood(url: str, agents: list[tuple[str, dict[str, Any]]], count: int,
          deadline: float) -> dict[str, Any]:
    """Each of `agents` (id, NATS connect keywords) publishes `count` RETRIEVAL questions
    at once; once every one has its final (or `deadline` passes): `seconds` from the
    first publish to the last final, and per agent sent, answered, refused (by code),
    lost and duplicate_finals. Runs in the calling process: the bench calls it in a
    child."""
    return asyncio.run(_flood(url, agents, count, deadline))


def ready() -> bool:
    """Nothing: the child process has started and imported this module."""
    return True
