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


def _admitted(agent: str, i: int) -> bytes:
    from shared.contracts.codec import encode
    from shared.contracts.pipeline import Admitted
    from shared.contracts.request import AgentRequest

    return encode(Admitted(request=AgentRequest(request_id=f"{agent}-{i}", session_id="s",
                                                agent_id=agent, query="q"), accepted_at=1.0))


async def _handling_order(nc: Client, lookahead: int) -> list[str]:
    """Agent A's 30 stage messages stored, then agent B's one, at a replica handling one
    at a time: the agents in the order the replica handled them."""
    stream, subject = await _stream(nc)
    js = nc.jetstream()
    for i, agent in enumerate(["flood-a"] * 30 + ["victim-b"]):
        await js.publish(subject, _admitted(agent, i), stream=stream)
    order: list[str] = []
    done = asyncio.Event()

    async def handle(msg: Delivery) -> None:
        order.append("victim-b" if b'"victim-b"' in msg.data else "flood-a")
        # The first long enough for all 31 to have reached the replica, however busy
        # the machine: then its turns decide alone.
        await asyncio.sleep(0.3 if len(order) == 1 else 0.002)
        if len(order) == 31:
            done.set()

    spec = _spec(stream, subject, max_inflight=1)
    spec = StageSpec(**{**{f: getattr(spec, f) for f in spec.__struct_fields__},
                        "lookahead": lookahead})
    consumer = StageConsumer(nc, spec, handle)
    await consumer.start()
    try:
        await asyncio.wait_for(done.wait(), 10)
    finally:
        await consumer.stop()
    return order


async def test_a_stage_takes_waiting_messages_in_turns_by_agent(admin_nc: Client) -> None:
    # The stream is FIFO: read in arrival order, B's message is handled last, after all
    # 30 of A's. With a lookahead the replica holds them and B's goes third: A's first
    # was taken on arrival, then one of A's (waiting before B's) and B's in turn.
    fifo = await _handling_order(admin_nc, lookahead=0)
    assert fifo.index("victim-b") == 30
    fair = await _handling_order(admin_nc, lookahead=64)
    # B has nothing in hand here: its message takes the spare slot on arrival, while
    # A's first still holds the one slot (without it, third: A's next, then B's).
    assert fair.index("victim-b") == 1
    assert fair.count("flood-a") == 30


async def test_an_agent_with_nothing_in_hand_does_not_wait_for_a_free_slot(
        admin_nc: Client) -> None:
    # Every slot of a replica (4) is held by agent A's messages, which hold on. B's first
    # message is handled at once, on the spare slot (4 // 4 = 1); C's first then waits
    # (the one spare is taken), and B's second too (B has one in hand). Released, every
    # message is handled.
    nc = admin_nc
    stream, subject = await _stream(nc)
    js = nc.jetstream()
    release = asyncio.Event()
    running: list[str] = []
    done: list[str] = []

    async def hold(msg: Delivery) -> None:
        rid = msg.data.split(b'"request_id":"', 1)[1].split(b'"', 1)[0].decode()
        running.append(rid)
        await release.wait()
        done.append(rid)

    spec = StageSpec(stream=stream, subject=subject, durable="work", max_inflight=4,
                     ack_wait=30, max_deliver=3, lookahead=32)
    consumer = StageConsumer(nc, spec, hold)
    await consumer.start()
    try:
        for i in range(6):
            await js.publish(subject, _admitted("flood-a", i), stream=stream)
        for _ in range(100):
            if len(running) == 4:
                break
            await asyncio.sleep(0.02)
        for payload in (_admitted("victim-b", 0), _admitted("victim-b", 1),
                        _admitted("victim-c", 0)):
            await js.publish(subject, payload, stream=stream)
        for _ in range(100):
            if consumer.stats.waiting == 4:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # anything else that would start, started
        assert running == ["flood-a-0", "flood-a-1", "flood-a-2", "flood-a-3", "victim-b-0"]
        assert consumer.stats.inflight == 5
        assert consumer.stats.waiting == 4
        release.set()
        for _ in range(200):
            if len(done) == 9:
                break
            await asyncio.sleep(0.02)
    finally:
        release.set()
        await consumer.stop()
    assert sorted(done) == sorted([*(f"flood-a-{i}" for i in range(6)), "victim-b-0",
                                   "victim-b-1", "victim-c-0"])


async def test_waiting_messages_are_kept_alive_and_given_back_at_stop(admin_nc: Client) -> None:
    # A replica handling one message at a time, for longer than two ack waits, while 5
    # more wait their turn: none is redelivered meanwhile (progress acks reach those
    # waiting too), and at stop those never handled go back to the stream at once.
    nc = admin_nc
    stream, subject = await _stream(nc)
    for i in range(6):
        await nc.jetstream().publish(subject, str(i).encode(), stream=stream)
    seen: Counter[bytes] = Counter()
    release = asyncio.Event()

    async def slow(msg: Delivery) -> None:
        seen[msg.data] += 1
        await release.wait()

    spec = StageSpec(stream=stream, subject=subject, durable="work", max_inflight=1,
                     ack_wait=1.5, max_deliver=3, lookahead=8)
    consumer = StageConsumer(nc, spec, slow)
    await consumer.start()
    try:
        await asyncio.sleep(3.5)  # more than two ack waits
        assert sum(seen.values()) == 1
        assert consumer.stats.waiting == 5
        assert consumer.stats.inflight == 1
    finally:
        # The one being handled ends half a second into the stop, as an answer would.
        asyncio.get_running_loop().call_later(0.5, release.set)
        await consumer.stop()
    info = await nc.jetstream().consumer_info(stream, "work")
    assert info.num_redelivered == 0
    # The five never handled were given back (nacked), not left for the ack wait: a
    # second replica takes them at once.
    again: Counter[bytes] = Counter()
    deliveries: set[int] = set()

    async def take(msg: Delivery) -> None:
        again[msg.data] += 1
        deliveries.add(msg.deliveries)

    second = StageConsumer(nc, _spec(stream, subject), take)
    await second.start()
    try:
        for _ in range(40):
            if sum(again.values()) >= 5:
                break
            await asyncio.sleep(0.05)
    finally:
        await second.stop()
    assert sorted(again) == sorted({str(i).encode() for i in range(6)} - set(seen))
    assert set(again.values()) == {1}
    # Their second delivery: none came back to the stopping replica first.
    assert deliveries == {2}


@pytest.mark.parametrize("lookahead", [0, 8])
async def test_a_message_redelivered_to_the_replica_holding_it_is_handled_once(
    admin_nc: Client, lookahead: int, caplog: pytest.LogCaptureFixture,
) -> None:
    # The replica's loop stalls past the ack wait (as a SIGSTOPped process does) while
    # its pull is still open: the server redelivers the message into that same pull. Read
    # after the stall, the second delivery must not start a second handling beside the
    # first (two finals of one request in `bench chaos`); the first's ack settles both.
    import time as clock

    nc = admin_nc
    stream, subject = await _stream(nc)
    calls: Counter[bytes] = Counter()
    finished = asyncio.Event()

    async def stalls(msg: Delivery) -> None:
        calls[msg.data] += 1
        if calls[msg.data] == 1:
            clock.sleep(2.2)  # noqa: ASYNC251 -- the loop itself stalls: no progress acks
            await asyncio.sleep(1.0)  # the redelivery is read meanwhile
            finished.set()

    spec = StageSpec(stream=stream, subject=subject, durable="work", max_inflight=4,
                     ack_wait=1.0, max_deliver=5, lookahead=lookahead)
    consumer = StageConsumer(nc, spec, stalls)
    await consumer.start()
    try:
        await nc.jetstream().publish(subject, b"once", stream=stream)
        await asyncio.wait_for(finished.wait(), 10)
        await asyncio.sleep(1.5)  # past another ack wait: nothing comes back
    finally:
        await consumer.stop()
    assert calls[b"once"] == 1
    # It was delivered again, into the same replica, and settled with the first.
    assert "delivered again while held here" in caplog.text
    info = await nc.jetstream().consumer_info(stream, "work")
    assert info.num_ack_pending == 0
    assert info.num_pending == 0
