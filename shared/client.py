"""Caller side of the contract: publish a request, follow its answer.

Used by the CLI, the gateway's gRPC face, the tests and the benchmark. Live
callers subscribe to `agent.response.<id>` before publishing (no race, no
JetStream consumer per request); `replay` reads a stored answer from the start
through an ordered JetStream consumer, for callers that join late.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats
from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.js.api import DeliverPolicy

from shared.codec import decode_chunk, encode
from shared.contracts import request as request_contract
from shared.contracts import response as response_contract
from shared.contracts.request import AgentRequest
from shared.contracts.response import ChunkKind, ResponseChunk, response_subject


class AnswerTimeoutError(Exception):
    """No final chunk arrived in time."""


async def publish_request(nc: Client, req: AgentRequest) -> None:
    """Durable publish on `agent.request` (JetStream ack; the msg id dedupes resends)."""
    await nc.jetstream().publish(
        request_contract.SUBJECT,
        encode(req),
        stream=request_contract.STREAM,
        headers={"Nats-Msg-Id": req.request_id},
    )


async def ask(
    nc: Client, req: AgentRequest, *, timeout: float = 120.0
) -> AsyncIterator[ResponseChunk]:
    """Publish `req` and yield its chunks in order until the final one."""
    sub = await nc.subscribe(response_subject(req.request_id))
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
    nc: Client, request_id: str, *, timeout: float = 120.0
) -> AsyncIterator[ResponseChunk]:
    """Read an answer from its first chunk, even if it started (or ended) before."""
    js = nc.jetstream()
    sub = await js.subscribe(
        response_subject(request_id),
        stream=response_contract.STREAM,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.ALL,
    )
    try:
        async for chunk in follow(sub, timeout=timeout):
            yield chunk
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
