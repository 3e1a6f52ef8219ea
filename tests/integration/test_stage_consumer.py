"""The stage consumer on a real nats-server: outstanding pulls, sharing, redelivery."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import pytest
from nats.aio.client import Client
from nats.js.api import RetentionPolicy, StreamConfig

from shared.runtime.consumer import Delivery, StageConsumer, StageSpec

pytestmark = pytest.mark.integration


async def _stream(nc: Client) -> tuple[str, str]:
    """A fresh work-queue stream and subject of its own for each test."""
    name = f"T{uuid.uuid4().hex[:10].upper()}"
    subject = f"test.{name.lower()}"
    await nc.jetstream().add_stream(StreamConfig(
        name=name, subjects=[subject], retention=RetentionPolicy.WORK_QUEUE))
    return name, subject


def _spec(stream: str, subject: str, **overrides: float) -> StageSpec:
    settings: dict[str, float] = {"max_inflight": 8, "ack_wait": 2.0, "max_deliver": 3}
    settings.update(overrides)
    return StageSpec(stream=stream, subject=subject, durable="work",
                     max_inflight=int(settings["max_inflight"]),
                     ack_wait=settings["ack_wait"], max_deliver=int(settings["max_deliver"]))


async def test_consumer_keeps_pulling_after_its_pulls_expire(admin_nc: Client) -> None:
    nc = admin_nc  # streams of its own: the admin's
    stream, subject = await _stream(nc)
    got: asyncio.Queue[bytes] = asyncio.Queue()

    async def handle(msg: Delivery) -> None:
        await got.put(msg.data)

    consumer = StageConsumer(nc, _spec(stream, subject), handle, heartbeat=0.1, expires=0.3)
    await consumer.start()
    try:
        await asyncio.sleep(1.0)  # three pulls expire (408) and are asked again
        await nc.jetstream().publish(subject, b"late", stream=stream)
        assert await asyncio.wait_for(got.get(), 3) == b"late"
    finally:
        await consumer.stop()


async def test_replicas_share_the_durable_consumer_and_each_message_is_handled_once(
    admin_nc: Client,
) -> None:
    nc = admin_nc  # streams of its own: the admin's
    stream, subject = await _stream(nc)
    handled: Counter[bytes] = Counter()
    by_replica: Counter[int] = Counter()
    done = asyncio.Event()

    def replica(n: int) -> StageConsumer:
        async def handle(msg: Delivery) -> None:
            await asyncio.sleep(0.005)  # work, so both replicas hold messages at once
            handled[msg.data] += 1
            by_replica[n] += 1
            if sum(handled.values()) == 60:
                done.set()

        return StageConsumer(nc, _spec(stream, subject, max_inflight=4), handle)

    replicas = [replica(0), replica(1)]
    for r in replicas:
        await r.start()
    try:
        for i in range(60):
            await nc.jetstream().publish(subject, str(i).encode(), stream=stream)
        await asyncio.wait_for(done.wait(), 10)
        await asyncio.sleep(0.2)  # nothing more arrives: every message was acked once
    finally:
        for r in replicas:
            await r.stop()
    assert set(handled.values()) == {1}
    assert len(handled) == 60
    assert by_replica[0] > 0
    assert by_replica[1] > 0
    info = await nc.jetstream().stream_info(stream)
    assert info.state.messages == 0  # work queue: acked messages are gone


async def test_nacked_and_failed_messages_come_back_with_their_delivery_count(
    admin_nc: Client,
) -> None:
    nc = admin_nc  # streams of its own: the admin's
    stream, subject = await _stream(nc)
    seen: list[tuple[bytes, int]] = []
    done = asyncio.Event()

    async def handle(msg: Delivery) -> None:
        seen.append((msg.data, msg.deliveries))
        if msg.deliveries == 1 and msg.data == b"nack":
            await msg.nack(delay=0.05)
        elif msg.deliveries == 1 and msg.data == b"raise":
            raise RuntimeError("a bug in the handler")
        if len(seen) == 4:
            done.set()

    consumer = StageConsumer(nc, _spec(stream, subject), handle)
    await consumer.start()
    try:
        await nc.jetstream().publish(subject, b"nack", stream=stream)
        await nc.jetstream().publish(subject, b"raise", stream=stream)
        await asyncio.wait_for(done.wait(), 10)
    finally:
        await consumer.stop()
    assert sorted(seen) == [(b"nack", 1), (b"nack", 2), (b"raise", 1), (b"raise", 2)]
