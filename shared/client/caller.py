"""Caller side of the contract: publish a request, follow its answer.

Used by the CLI, the doors (gRPC, HTTP, the OpenAI door), the tests and the benchmarks. A caller
publishes on its own `agent.request.<agent_id>` (and its verdicts on
`agent.feedback.<agent_id>`) and reads `agent.response.<agent_id>.<request_id>`; its
credential allows nothing else. Live callers subscribe to the
response subject before publishing (no race, no JetStream consumer per request);
`replay` asks the gateway for a stored answer from the start (`agent.replay.<agent_id>`),
for callers that join late; an agent creates no JetStream consumer. `ask` replays what
its subscription missed while the connection was away (`follow_live`).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Protocol

import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.errors import APIError

from shared.client.answers import AnswerRouter
from shared.contracts import feedback as feedback_contract
from shared.contracts import replay as replay_contract
from shared.contracts import request as request_contract
from shared.contracts.codec import decode_chunk, encode
from shared.contracts.errors import RetryableError
from shared.contracts.feedback import Feedback, FeedbackAck
from shared.contracts.request import AgentRequest, request_subject
from shared.contracts.response import ChunkKind, ErrorCode, ResponseChunk, response_subject


class AnswerTimeoutError(RetryableError):
    """No final chunk arrived in time."""

    code = ErrorCode.DEADLINE_EXCEEDED


class RequestRefusedError(RetryableError):
    """AGENT_REQUESTS refused the request: it holds as many of this agent's waiting
    requests as it may (STREAM_MAX_PER_AGENT), or is full for everyone
    (STREAM_MAX_MSGS, STREAM_MAX_BYTES). Nothing was queued; ask again later."""

    code = ErrorCode.QUEUE_FULL


# How long `ask` publishes its request again (the same msg id: stored once) when no ack
# comes, through a server restart or a leader election, before its caller hears the bus
# failed: a caller that then asks again under a new id gets a second run if a lost ack's
# publish was stored after all, so the retry is here, where the id is kept.
PUBLISH_PATIENCE = 5.0
# JetStream's "could not store" (maximum messages, per subject, or bytes exceeded).
_JS_STORE_FAILED = 10077


def request_msg_id(req: AgentRequest) -> str:
    """The stream's dedupe key for one request: its ids and 128 random bits. The
    AGENT_REQUESTS stream deduplicates across every agent's subject, so a key another
    agent could predict would let it publish first and have this request dropped as a
    duplicate; a resend of the same request reuses the key it was given."""
    return f"{req.agent_id}:{req.request_id}:{secrets.token_hex(16)}"


async def publish_request(nc: Client, req: AgentRequest, *, msg_id: str = "",
                          headers: Mapping[str, str] | None = None) -> None:
    """Durable publish on `agent.request.<agent_id>` (JetStream ack). A resend with the
    same `msg_id` is a no-op; without one, a fresh unpredictable id is used. `headers`:
    more headers (a W3C `traceparent`: the request's trace continues in the workers).
    A full stream raises RequestRefusedError."""
    try:
        await nc.jetstream().publish(
            request_subject(req.agent_id),
            encode(req),
            stream=request_contract.STREAM,
            headers={**(headers or {}), "Nats-Msg-Id": msg_id or request_msg_id(req)},
        )
    except APIError as exc:
        if exc.err_code == _JS_STORE_FAILED:
            raise RequestRefusedError(
                f"request {req.request_id} refused: {exc.description}") from None
        raise


async def publish_until_stored(nc: Client, req: AgentRequest, *, give_up_at: float,
                               pause: float = 0.2,
                               headers: Mapping[str, str] | None = None) -> None:
    """Publish again until the stream acknowledges the request (through a server
    restart or a stream's leader election): the same msg id, so it is stored once.
    After `give_up_at` (time.monotonic()) the last error is raised; a full stream's
    refusal (RequestRefusedError) at once."""
    msg_id = request_msg_id(req)
    while True:
        try:
            await publish_request(nc, req, msg_id=msg_id, headers=headers)
            return
        except RequestRefusedError:
            raise
        except Exception:
            if time.monotonic() > give_up_at:
                raise
            await asyncio.sleep(pause)


class MsgSource(Protocol):
    """Where one answer's messages come from: its subscription, or its queue at an
    `AnswerRouter`."""

    async def next_msg(self, timeout: float) -> Msg: ...


async def ask(
    nc: Client, req: AgentRequest, *, timeout: float = 120.0,
    headers: Mapping[str, str] | None = None, router: AnswerRouter | None = None,
) -> AsyncGenerator[ResponseChunk, None]:
    """Publish `req` (with `headers`, as `publish_request`; again with the same msg id
    for up to PUBLISH_PATIENCE while no ack comes) and yield its chunks in order until
    the final one. With a `router` (a door asking for many requests of the
    same agents) the chunks come through the agent's subscription there, not one of
    the request's own."""
    source = (router.waiting(req.agent_id, req.request_id) if router is not None
              else _subscribed(nc, response_subject(req.agent_id, req.request_id)))
    async with source as messages:
        reconnects = _reconnects(nc)
        await publish_until_stored(nc, req, headers=headers,
                                   give_up_at=time.monotonic() + PUBLISH_PATIENCE)
        async for chunk in follow_live(nc, messages, req.agent_id, req.request_id,
                                       timeout=timeout, reconnects=reconnects):
            yield chunk


@contextlib.asynccontextmanager
async def _subscribed(nc: Client, subject: str) -> AsyncIterator[Subscription]:
    """The request's own subscription, for as long as its answer is followed."""
    sub = await nc.subscribe(subject)
    try:
        yield sub
    finally:
        await sub.unsubscribe()


async def follow(sub: Subscription, *, timeout: float) -> AsyncIterator[ResponseChunk]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise AnswerTimeoutError(f"no final chunk within {timeout}s")
        try:
            msg = await sub.next_msg(timeout=remaining)
        except nats.errors.TimeoutError as exc:
            raise AnswerTimeoutError(f"no final chunk within {timeout}s") from exc
        chunk = decode_chunk(msg.data)
        yield chunk
        if chunk.is_final:
            return


# How often a live follower looks at the connection's reconnect count while no chunk
# comes (a dict read): the replay after a reconnect starts within this much of it.
RECONNECT_POLL = 0.25
# Past its deadline a follower still reads the chunks already delivered, each waited for
# this long at most (they are in the client's queue: no wait is needed to get them).
BUFFERED_POLL = 0.01
# A replay whose first chunk does not come within this (no gateway yet after a server
# restart, or one busy) is asked again this much later, the live subscription read
# meanwhile.
REPLAY_FIRST_CHUNK = 2.0
REPLAY_RETRY = 0.5


def _reconnects(nc: Client) -> int:
    return int(nc.stats.get("reconnects", 0))


class Merged:
    """One answer's chunks from two sources (the live subscription, and replays of what
    is stored after a reconnect), each chunk once, in order: a chunk whose seq is not
    past the last one passed on was passed on already (seqs grow along an answer, resets
    and redeliveries included); nothing after the first final."""

    def __init__(self) -> None:
        self.last_seq = -1
        self.done = False

    def take(self, chunk: ResponseChunk) -> bool:
        """Pass `chunk` on?"""
        if self.done or chunk.seq <= self.last_seq:
            return False
        self.last_seq = chunk.seq
        self.done = chunk.is_final
        return True


class _ReplayUnavailableError(RetryableError):
    """No gateway answered the replay (yet), or it was too busy: ask again later."""

    code = ErrorCode.BUS_UNAVAILABLE


async def follow_live(
    nc: Client, sub: MsgSource, agent_id: str, request_id: str, *, timeout: float,
    reconnects: int | None = None,
) -> AsyncIterator[ResponseChunk]:
    """`follow` for a caller subscribed to its answer's subject, across reconnects: what
    was published while the connection was away (a nats-server restart) never reaches
    the subscription, so after each reconnect (the client's `reconnects` count moved past
    `reconnects`, default: now) the stored answer is replayed (`replay`) and merged with
    the live chunks (`Merged`): each chunk once, in order, one final. A replay that finds
    nothing stored yet leaves the rest to the live subscription, which is back by then."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    seen = _reconnects(nc) if reconnects is None else reconnects
    merged = Merged()
    owed_at: float | None = None  # when a replay is owed (a reconnect was seen)
    while not merged.done:
        remaining = deadline - loop.time()
        # Past the deadline (a frozen process wakes late) what already came is still read
        # before giving up, the final among it above all; no replay is started then.
        late = remaining <= 0
        if not late and _reconnects(nc) != seen:
            seen, owed_at = _reconnects(nc), loop.time()
        if not late and owed_at is not None and loop.time() >= owed_at:
            try:
                async for chunk in _replay_stored(nc, agent_id, request_id, remaining):
                    if merged.take(chunk):
                        yield chunk
                owed_at = None
            except _ReplayUnavailableError:
                owed_at = loop.time() + REPLAY_RETRY
            continue
        try:
            msg = await sub.next_msg(timeout=BUFFERED_POLL if late
                                     else min(remaining, RECONNECT_POLL))
        except nats.errors.TimeoutError:
            if late:
                raise AnswerTimeoutError(f"no final chunk within {timeout}s") from None
            continue
        chunk = decode_chunk(msg.data)
        if merged.take(chunk):
            yield chunk


async def _replay_stored(nc: Client, agent_id: str, request_id: str, timeout: float
                         ) -> AsyncIterator[ResponseChunk]:
    """The stored chunks of the answer (`replay`); nothing when none is stored yet."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    try:
        await nc.publish(replay_contract.replay_subject(agent_id), request_id.encode(),
                         reply=inbox)
        first = True
        while True:
            try:
                msg = await sub.next_msg(timeout=min(timeout, REPLAY_FIRST_CHUNK)
                                         if first else timeout)
            except nats.errors.TimeoutError:
                raise _ReplayUnavailableError from None
            if not msg.data and msg.headers and msg.headers.get("Status") == "503":
                raise _ReplayUnavailableError  # no responders: no gateway (yet)
            chunk = decode_chunk(msg.data)
            code = chunk.error.code if chunk.error else ""
            if first and code == ErrorCode.UNKNOWN_REQUEST:
                return  # nothing stored yet: all of it will come live
            if first and code == ErrorCode.CONCURRENCY_LIMITED:
                raise _ReplayUnavailableError
            first = False
            yield chunk
            if chunk.is_final:
                return
    finally:
        await sub.unsubscribe()


async def replay(
    nc: Client, agent_id: str, request_id: str, *, timeout: float = 120.0
) -> AsyncIterator[ResponseChunk]:
    """Read an answer from its first chunk, even if it started (or ended) before: the
    gateway sends the stored chunks to this connection's inbox, following an answer in
    progress to its final chunk. Nothing stored for this agent under `request_id`
    (unknown, expired, or another agent's): one final UNKNOWN_REQUEST chunk. No gateway
    answering: AnswerTimeoutError after `timeout`."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    try:
        await nc.publish(replay_contract.replay_subject(agent_id), request_id.encode(),
                         reply=inbox)
        async for chunk in follow(sub, timeout=timeout):
            yield chunk
    finally:
        await sub.unsubscribe()


async def send_feedback(
    nc: Client, agent_id: str, feedback: Feedback, *, timeout: float = 10.0
) -> FeedbackAck:
    """Publish a verdict on `agent.feedback.<agent_id>` (JetStream ack) and wait for the
    gateway's acknowledgement on `agent.response.<agent_id>._feedback.<request_id>`
    (subscribed before publishing): the first one of the same part (or of the whole
    request), since verdicts on several parts of one request are acked there too. A
    request id that cannot be part of a subject is acknowledged on
    `..._feedback._invalid`, which this does not follow."""
    sub = await nc.subscribe(feedback_contract.ack_subject(agent_id, feedback.request_id))
    try:
        await nc.jetstream().publish(feedback_contract.feedback_subject(agent_id),
                                     encode(feedback), stream=feedback_contract.STREAM)
        until = time.monotonic() + timeout
        while True:
            try:
                msg = await sub.next_msg(timeout=max(until - time.monotonic(), 0.001))
            except nats.errors.TimeoutError as exc:
                raise AnswerTimeoutError(
                    f"no feedback acknowledgement within {timeout}s") from exc
            ack = msgspec.json.decode(msg.data, type=FeedbackAck)
            if ack.part == feedback.part:
                return ack
    finally:
        await sub.unsubscribe()


def is_text(chunk: ResponseChunk) -> bool:
    """Part of the answer's text (status notes are not; a part marker's heading is)."""
    return chunk.kind in (ChunkKind.TEXT, ChunkKind.CLARIFICATION, ChunkKind.PART) or (
        chunk.is_final and bool(chunk.text))


def assemble(chunks: list[ResponseChunk]) -> str:
    """The answer text, honouring RESET chunks from a redelivered stage: a reset drops
    the text since the last part marker (a split message's earlier parts stay)."""
    parts: list[str] = []
    kept = 0  # the text before the current part's marker
    for chunk in chunks:
        if chunk.kind == ChunkKind.RESET:
            del parts[kept:]
        elif chunk.kind == ChunkKind.PART:
            parts.append(chunk.text)
            kept = len(parts)
        elif is_text(chunk):
            parts.append(chunk.text)
    return "".join(parts)
