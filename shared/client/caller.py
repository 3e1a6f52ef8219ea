"""Caller side of the contract: publish a request, follow its answer.

Used by the CLI, the gateway's gRPC face, the tests and the benchmarks. A caller
publishes on its own `agent.request.<agent_id>` (and its verdicts on
`agent.feedback.<agent_id>`) and reads `agent.response.<agent_id>.<request_id>`; its
credential allows nothing else. Live callers subscribe to the
response subject before publishing (no race, no JetStream consumer per request);
`replay` reads a stored answer from the start through an ephemeral consumer filtered to
that one subject, for callers that join late.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections.abc import AsyncIterator

import msgspec
import nats
from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from shared.contracts import feedback as feedback_contract
from shared.contracts import request as request_contract
from shared.contracts import response as response_contract
from shared.contracts.codec import decode_chunk, encode
from shared.contracts.feedback import Feedback, FeedbackAck
from shared.contracts.request import AgentRequest, request_subject
from shared.contracts.response import ChunkKind, ResponseChunk, response_subject


class AnswerTimeoutError(Exception):
    """No final chunk arrived in time."""


def request_msg_id(req: AgentRequest) -> str:
    """The stream's dedupe key for one request: its ids and 128 random bits. The
    AGENT_REQUESTS stream deduplicates across every agent's subject, so a key another
    agent could predict would let it publish first and have this request dropped as a
    duplicate; a resend of the same request reuses the key it was given."""
    return f"{req.agent_id}:{req.request_id}:{secrets.token_hex(16)}"


async def publish_request(nc: Client, req: AgentRequest, *, msg_id: str = "") -> None:
    """Durable publish on `agent.request.<agent_id>` (JetStream ack). A resend with the
    same `msg_id` is a no-op; without one, a fresh unpredictable id is used."""
    await nc.jetstream().publish(
        request_subject(req.agent_id),
        encode(req),
        stream=request_contract.STREAM,
        headers={"Nats-Msg-Id": msg_id or request_msg_id(req)},
    )


async def publish_until_stored(nc: Client, req: AgentRequest, *, give_up_at: float,
                               pause: float = 0.2) -> None:
    """Publish again until the stream acknowledges the request (through a server
    restart or a stream's leader election): the same msg id, so it is stored once.
    After `give_up_at` (time.monotonic()) the last error is raised."""
    msg_id = request_msg_id(req)
    while True:
        try:
            await publish_request(nc, req, msg_id=msg_id)
            return
        except Exception:
            if time.monotonic() > give_up_at:
                raise
            await asyncio.sleep(pause)


async def ask(
    nc: Client, req: AgentRequest, *, timeout: float = 120.0
) -> AsyncIterator[ResponseChunk]:
    """Publish `req` and yield its chunks in order until the final one."""
    sub = await nc.subscribe(response_subject(req.agent_id, req.request_id))
    try:
        await publish_request(nc, req)
        async for chunk in follow(sub, timeout=timeout):
            yield chunk
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


async def replay(
    nc: Client, agent_id: str, request_id: str, *, timeout: float = 120.0
) -> AsyncIterator[ResponseChunk]:
    """Read an answer from its first chunk, even if it started (or ended) before.

    The consumer is named and filtered to this answer's subject: that is the one form
    of consumer creation an agent's credential allows on the response stream."""
    subject = response_subject(agent_id, request_id)
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.jetstream().add_consumer(
        response_contract.STREAM,
        ConsumerConfig(
            name=f"replay-{uuid.uuid4().hex[:12]}",
            filter_subject=subject,
            deliver_subject=inbox,
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=30.0,
            mem_storage=True,
        ),
    )
    try:
        async for chunk in follow(sub, timeout=timeout):
            yield chunk
    finally:
        await sub.unsubscribe()


async def send_feedback(
    nc: Client, agent_id: str, feedback: Feedback, *, timeout: float = 10.0
) -> FeedbackAck:
    """Publish a verdict on `agent.feedback.<agent_id>` (JetStream ack) and wait for the
    gateway's acknowledgement on `agent.response.<agent_id>._feedback.<request_id>`
    (subscribed before publishing). A request id that cannot be part of a subject is
    acknowledged on `..._feedback._invalid`, which this does not follow."""
    sub = await nc.subscribe(feedback_contract.ack_subject(agent_id, feedback.request_id))
    try:
        await nc.jetstream().publish(feedback_contract.feedback_subject(agent_id),
                                     encode(feedback), stream=feedback_contract.STREAM)
        try:
            msg = await sub.next_msg(timeout=timeout)
        except nats.errors.TimeoutError as exc:
            raise AnswerTimeoutError(f"no feedback acknowledgement within {timeout}s") from exc
        return msgspec.json.decode(msg.data, type=FeedbackAck)
    finally:
        await sub.unsubscribe()


def assemble(chunks: list[ResponseChunk]) -> str:
    """The answer text, honouring RESET chunks from a redelivered stage."""
    parts: list[str] = []
    for chunk in chunks:
        if chunk.kind == ChunkKind.RESET:
            parts.clear()
        elif chunk.kind in (ChunkKind.TEXT, ChunkKind.CLARIFICATION) or (
            chunk.is_final and chunk.text
        ):
            parts.append(chunk.text)
    return "".join(parts)
