"""One final chunk per run of a request on a real nats-server, whoever answers: two
deliveries of one request answering at once (one cut off mid-answer, the other its
redelivery) send one final between them, never two different ones."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.js.errors import NotFoundError

from intentroute.stack.nats_users import service_env
from shared.contracts import response
from shared.contracts.codec import decode_chunk, encode
from shared.contracts.response import ChunkKind, ResponseChunk
from shared.runtime.answer_stream import ANSWER_LEASE, AnswerStream, Lease
from shared.runtime.bus import Bus
from tests.helpers.nats_auth import assert_publish_refused
from tests.helpers.nats_auth import connect_recording as recording
from tests.helpers.nats_sync import flushed

pytestmark = pytest.mark.integration
AGENT = "agent-a"


@pytest.fixture
async def worker_nc(nats_url: str) -> AsyncIterator[Client]:
    """A connection as a worker's service user (what publishes answers)."""
    env = service_env(Path(os.environ.get("INTENTROUTE_HOME", ".intentroute")),
                      "generator-main")
    client = await nats.connect(nats_url, user=env["NATS_USER"],
                                password=env["NATS_PASSWORD"],
                                inbox_prefix=env["NATS_INBOX_PREFIX"])
    yield client
    await client.drain()


async def finals_seen(nc: Client, rid: str, answer: Any, agent: str = AGENT) -> list[bytes]:
    """The final chunks a live subscriber of the answer's subject receives."""
    seen: list[bytes] = []

    async def on_chunk(msg: Any) -> None:
        if decode_chunk(msg.data).is_final:
            seen.append(msg.data)

    sub = await nc.subscribe(response.response_subject(agent, rid), cb=on_chunk)
    await flushed(nc)
    await answer()
    await nc.flush()
    # A publish that outlived its ack wait on a busy machine still arrives: give it
    # time, then time for a second final, if any, to arrive too.
    for _ in range(30):
        if seen:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.3)
    await sub.unsubscribe()
    return seen


async def stored_finals(nc: Client, rid: str) -> list[bytes]:
    js = nc.jetstream()
    sub = await js.subscribe(response.response_subject(AGENT, rid), ordered_consumer=True)
    finals = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=0.5)
            except nats.errors.TimeoutError:
                break
            if decode_chunk(msg.data).is_final:
                finals.append(msg.data)
    finally:
        await sub.unsubscribe()
    return finals


async def test_two_deliveries_answering_at_once_send_one_final(
    worker_nc: Client, admin_nc: Client
) -> None:
    rid = uuid.uuid4().hex
    first = AnswerStream(Bus(worker_nc), AGENT, rid, run="7")
    second = AnswerStream(Bus(worker_nc), AGENT, rid, run="7")

    async def answer() -> None:
        await first.text("one answer")
        await second.text("a different answer")
        await asyncio.gather(first.final(decision=None), second.final(decision=None))

    seen = await finals_seen(admin_nc, rid, answer)
    assert len(set(seen)) == 1, seen  # identical copies at most, never two answers
    assert await stored_finals(admin_nc, rid) == seen[:1]


async def test_a_redelivery_that_streamed_past_the_stored_answer_sends_nothing(
    worker_nc: Client, admin_nc: Client
) -> None:
    """The redelivery reset the answer before the first delivery's final was stored;
    the last stored chunk is its own, not a final, yet the answer is given."""
    rid = uuid.uuid4().hex
    first = AnswerStream(Bus(worker_nc), AGENT, rid, run="9")
    redelivery = AnswerStream(Bus(worker_nc), AGENT, rid, run="9", start_seq=1)

    async def answer() -> None:
        await first.text("the first answer")
        await redelivery.reset()
        await first.final(decision=None)
        await redelivery.text("a second answer")
        await redelivery.status("still going")
        await redelivery.final(decision=None)

    seen = await finals_seen(admin_nc, rid, answer)
    assert [decode_chunk(c).text for c in seen] == ["the first answer"]
    assert await stored_finals(admin_nc, rid) == seen


async def test_a_redelivery_ahead_of_a_live_claimant_waits_for_its_final(
    worker_nc: Client, admin_nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bench chaos`: both deliveries held back (Postgres away) until the same moment.
    The first claims its final, then takes a moment to publish it; the redelivery has
    streamed past that final's seq, loses the claim, and used to send its own final all
    the same: two different finals reached the caller (the stream stored one)."""
    rid = uuid.uuid4().hex
    first = AnswerStream(Bus(worker_nc), AGENT, rid, run="5")
    redelivery = AnswerStream(Bus(worker_nc), AGENT, rid, run="5", start_seq=1)
    publish = first._publish_final

    async def slow_publish(payload: bytes) -> None:
        await asyncio.sleep(0.3)
        await publish(payload)

    monkeypatch.setattr(first, "_publish_final", slow_publish)

    async def answer() -> None:
        await first.text("the first answer")
        await redelivery.reset()
        await redelivery.text("a second answer")
        await redelivery.status("still going")

        async def then_redelivery() -> None:
            await asyncio.sleep(0.1)  # the first has claimed by now
            await redelivery.final(decision=None)

        await asyncio.gather(first.final(decision=None), then_redelivery())

    seen = await finals_seen(admin_nc, rid, answer)
    assert [decode_chunk(c).text for c in seen] == ["the first answer"]
    assert await stored_finals(admin_nc, rid) == seen


async def test_a_redelivery_ahead_of_a_dead_claimant_sends_its_own_final_after_the_wait(
    worker_nc: Client, admin_nc: Client
) -> None:
    """The claimant died between its claim and its final, and the redelivery streamed
    past the claimed chunk's seq: once the claimant's time is up, its own final goes
    (the answer never goes back)."""
    from shared.runtime.answer_stream import CLAIMANT_WAIT

    rid = uuid.uuid4().hex
    bus = Bus(worker_nc)
    dead = encode(ResponseChunk(request_id=rid, seq=1, text="claimed", kind=ChunkKind.FINAL,
                                is_final=True))
    assert await bus.publish_first(response.claim_subject(AGENT, rid, "6"), dead,
                                   stream=response.CLAIM_STREAM, msg_id=f"dead-{rid}") == dead
    redelivery = AnswerStream(bus, AGENT, rid, run="6", start_seq=1)
    took: list[float] = []

    async def answer() -> None:
        await redelivery.reset()
        await redelivery.text("its own answer")
        started = time.monotonic()
        await redelivery.final(decision=None)
        took.append(time.monotonic() - started)

    seen = await finals_seen(admin_nc, rid, answer)
    assert [decode_chunk(c).text for c in seen] == ["its own answer"]
    assert await stored_finals(admin_nc, rid) == seen
    assert took[0] >= CLAIMANT_WAIT - 0.25


async def test_a_claimed_answer_whose_delivery_died_is_sent_by_the_next(
    worker_nc: Client, admin_nc: Client
) -> None:
    """The claim is stored but its delivery died before sending the final chunk: the
    redelivery sends that chunk, not its own."""
    rid = uuid.uuid4().hex
    bus = Bus(worker_nc)
    dead = encode(ResponseChunk(request_id=rid, seq=0, text="claimed",
                                kind=ChunkKind.FINAL, is_final=True))
    claim = response.claim_subject(AGENT, rid, "3")
    assert await bus.publish_first(claim, dead, stream=response.CLAIM_STREAM,
                                   msg_id="dead") == dead
    # A resend of the same claim (its ack lost) finds itself; another one finds it too.
    assert await bus.publish_first(claim, dead, stream=response.CLAIM_STREAM,
                                   msg_id="dead") == dead
    assert await bus.publish_first(claim, b"other", stream=response.CLAIM_STREAM,
                                   msg_id="other") == dead

    redelivery = AnswerStream(bus, AGENT, rid, run="3")

    async def answer() -> None:
        await redelivery.text("its own answer")
        await redelivery.final(decision=None)

    seen = await finals_seen(admin_nc, rid, answer)
    assert seen == [dead]
    assert await stored_finals(admin_nc, rid) == [dead]


async def test_each_run_of_a_request_id_gets_its_own_final(
    worker_nc: Client, admin_nc: Client
) -> None:
    """Each run of a request id (a dead letter replayed by an operator; before the
    gateway admitted an id once, also a new message naming it) is answered on its own;
    the runs do not share a claim."""
    rid = uuid.uuid4().hex
    for run, text in (("11", "first"), ("11r5", "replayed"), ("12", "again")):
        stream = AnswerStream(Bus(worker_nc), AGENT, rid, run=run)
        await stream.text(text)

        async def answer(stream: AnswerStream = stream) -> None:
            await stream.final(decision=None)

        (seen,) = await finals_seen(admin_nc, rid, answer)
        assert decode_chunk(seen).text == text
    assert [decode_chunk(c).text for c in await stored_finals(admin_nc, rid)] == [
        "first", "replayed", "again"]


async def test_agents_cannot_touch_claims(nats_url: str, agents: dict[str, Any]) -> None:
    conn = await recording(nats_url, **agents[AGENT].nats)
    try:
        await assert_publish_refused(
            conn, response.claim_subject(AGENT, uuid.uuid4().hex, "1"))
        await assert_publish_refused(
            conn, f"$JS.API.DIRECT.GET.{response.CLAIM_STREAM}.x")
    finally:
        await conn.nc.close()


async def test_the_only_delivery_needs_no_claim_and_a_redelivery_finds_its_answer(
    worker_nc: Client, admin_nc: Client
) -> None:
    """A first delivery within half its ack wait, its connection never lost, is the only
    one: its final goes out unclaimed. A redelivery after all (it died before acking)
    asks before it streams anything, and finds that final as the answer subject's last
    message (read by subject: a worker reads no stream by sequence)."""
    rid = uuid.uuid4().hex
    bus = Bus(worker_nc)
    only = AnswerStream(bus, AGENT, rid, run="5")
    lease = ANSWER_LEASE.set(Lease.start(1, 2.0, bus.reconnects, time.time()))
    try:
        await only.text("the answer")

        async def answer() -> None:
            await only.final(decision=None)

        seen = await finals_seen(admin_nc, rid, answer)
    finally:
        ANSWER_LEASE.reset(lease)
    assert [decode_chunk(c).text for c in seen] == ["the answer"]
    with pytest.raises(NotFoundError):
        await admin_nc.jetstream().get_last_msg(
            response.CLAIM_STREAM, response.claim_subject(AGENT, rid, "5"))

    redelivery = AnswerStream(bus, AGENT, rid, run="5", start_seq=1)
    assert await redelivery.final_stored()
    assert not await AnswerStream(bus, AGENT, rid, run="6").final_stored()  # another run
    assert await stored_finals(admin_nc, rid) == seen


async def test_a_redelivery_defers_to_the_claim_of_an_earlier_delivery(
    worker_nc: Client, admin_nc: Client
) -> None:
    """Before it answers, a redelivery looks for its run's claim: none, it answers; one
    not sent yet, it sends that; one sent, nothing."""
    rid = uuid.uuid4().hex
    bus = Bus(worker_nc)
    assert not await AnswerStream(bus, AGENT, rid, run="4").send_claimed()
    claimed = encode(ResponseChunk(request_id=rid, seq=2, text="claimed",
                                   kind=ChunkKind.FINAL, is_final=True))
    await bus.publish_first(response.claim_subject(AGENT, rid, "4"), claimed,
                            stream=response.CLAIM_STREAM, msg_id="earlier")

    async def redelivered() -> None:
        assert await AnswerStream(bus, AGENT, rid, run="4").send_claimed()

    assert await finals_seen(admin_nc, rid, redelivered) == [claimed]
    assert await finals_seen(admin_nc, rid, redelivered) == []  # stored now
    assert await stored_finals(admin_nc, rid) == [claimed]


async def test_a_claim_not_sealed_by_a_worker_is_nobodys_answer(
    worker_nc: Client, admin_nc: Client
) -> None:
    """Claims are sealed with the workers' key. A message on a claim subject from
    anyone else (the admin here; an agent may not publish there, and deliveries an agent
    points at the subject, which permissions do not stop, are not stored by the stream
    on this server) is no claim: the request is answered with its own final."""
    victim, rid = "tests", uuid.uuid4().hex
    forged = encode(ResponseChunk(request_id=rid, seq=0, text="injected answer",
                                  kind=ChunkKind.FINAL, is_final=True))
    await admin_nc.jetstream().publish(response.claim_subject(victim, rid, "1"), forged,
                                       stream=response.CLAIM_STREAM)
    answering = AnswerStream(Bus(worker_nc), victim, rid, run="1")
    assert not await answering.send_claimed()
    await answering.text("the victim's own answer")

    async def answer() -> None:
        await answering.final(decision=None)

    seen = await finals_seen(admin_nc, rid, answer, agent=victim)
    assert [decode_chunk(c).text for c in seen] == ["the victim's own answer"]
