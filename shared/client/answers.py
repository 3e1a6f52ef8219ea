"""Answers for a caller that asks many questions for the same agents (a door in front of
the pipeline): one subscription per agent, `agent.response.<agent_id>.*`, its chunks
handed to each waiting request's own queue by subject, instead of a subscription made
and dropped per request (a SUB and an UNSUB on the wire, and the server's work for
each, on every request's path).

An agent's subscription is made on its first request and dropped once none of its
requests has waited for LINGER seconds: while it lasts it also brings the chunks of the
agent's other callers (a NATS client of the same agent), which are dropped here, so an
agent that stops using the door stops costing it. Waiters are registered before the
request is published, so no chunk can come before its queue.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from shared.contracts.codec import decode_chunk
from shared.contracts.errors import PermanentError
from shared.contracts.response import (
    INVALID_REQUEST_ID,
    SUBJECT_PREFIX,
    ErrorCode,
    response_subject,
)

# Seconds an agent's subscription outlives its last waiting request: a caller asking
# again within it pays no SUB. Past it, the agent's other callers' chunks stop coming.
LINGER = 10.0


class RequestInFlightError(PermanentError):
    """The agent has a request with this id waiting for its answer already: both would
    read one subject's chunks (a door's caller may choose the id). Nothing was published."""

    code = ErrorCode.DUPLICATE_REQUEST


class Waiting:
    """One request's chunks, as a subscription's `next_msg` gives them."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Msg] = asyncio.Queue()

    async def next_msg(self, timeout: float) -> Msg:
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except TimeoutError:
            raise nats.errors.TimeoutError from None


class _Agent:
    def __init__(self) -> None:
        self.sub: Subscription | None = None
        self.ready = asyncio.Event()
        self.waiting = 0
        self.drop: asyncio.TimerHandle | None = None


class AnswerRouter:
    def __init__(self, nc: Client, *, linger: float = LINGER) -> None:
        self._nc = nc
        self._linger = linger
        self._agents: dict[str, _Agent] = {}
        self._waiting: dict[str, Waiting] = {}

    @contextlib.asynccontextmanager
    async def waiting(self, agent_id: str, request_id: str) -> AsyncIterator[Waiting]:
        """The request's queue, subscribed before this yields (publish inside).
        RequestInFlightError, before anything is subscribed, when the agent's request
        of that id is waiting still (two such callers mixed their chunks in one queue,
        and the second to leave failed on the entry the first had removed)."""
        subject = response_subject(agent_id, request_id)
        if subject in self._waiting:
            raise RequestInFlightError(
                f"request {request_id!r} of agent {agent_id!r} is waiting for its answer "
                f"already: one request at a time per id")
        waiting = self._waiting[subject] = Waiting()
        agent = self._agents.get(agent_id)
        if agent is None:
            agent = self._agents[agent_id] = _Agent()
            agent.waiting += 1
            try:
                agent.sub = await self._nc.subscribe(f"{SUBJECT_PREFIX}.{agent_id}.*",
                                                     cb=self._deliver)
            except BaseException:
                del self._agents[agent_id]
                del self._waiting[subject]
                agent.ready.set()
                raise
            agent.ready.set()
        else:
            agent.waiting += 1
            if agent.drop is not None:
                agent.drop.cancel()
                agent.drop = None
            await agent.ready.wait()  # another request of the agent is subscribing
        try:
            if agent.sub is None:  # that subscription failed: this request's turn
                raise nats.errors.ConnectionClosedError
            yield waiting
        finally:
            del self._waiting[subject]
            agent.waiting -= 1
            if agent.waiting == 0 and self._agents.get(agent_id) is agent:
                agent.drop = asyncio.get_running_loop().call_later(
                    self._linger, self._unsubscribe, agent_id, agent)

    def subscribed(self) -> set[str]:
        """The agents whose subscription is open now."""
        return {agent for agent, state in self._agents.items() if state.sub is not None}

    async def close(self) -> None:
        for agent in list(self._agents.values()):
            if agent.drop is not None:
                agent.drop.cancel()
            if agent.sub is not None:
                with contextlib.suppress(Exception):
                    await agent.sub.unsubscribe()
        self._agents.clear()

    async def _deliver(self, msg: Msg) -> None:
        waiting = self._waiting.get(msg.subject)
        if waiting is None and msg.subject.endswith(_INVALID_SUFFIX):
            # A refusal that names its request id in the chunk (DUPLICATE_REQUEST, input
            # naming an admitted id): the gateway answers it on the agent's `_invalid`
            # subject, never on the id's own, which keeps its one final chunk.
            waiting = self._waiting.get(_named_subject(msg))
        if waiting is not None:
            waiting.queue.put_nowait(msg)

    def _unsubscribe(self, agent_id: str, agent: _Agent) -> None:
        if agent.waiting or self._agents.get(agent_id) is not agent:
            return
        del self._agents[agent_id]
        if agent.sub is not None:
            task = asyncio.create_task(agent.sub.unsubscribe())
            task.add_done_callback(_ignore)


_INVALID_SUFFIX = f".{INVALID_REQUEST_ID}"


def _named_subject(msg: Msg) -> str:
    """The answer subject of the request a chunk on `_invalid` names ("" if none)."""
    try:
        request_id = decode_chunk(msg.data).request_id
    except Exception:  # not a chunk: nobody's
        return ""
    agent = msg.subject[len(SUBJECT_PREFIX) + 1:-len(_INVALID_SUFFIX)]
    return response_subject(agent, request_id) if request_id else ""


def _ignore(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()
