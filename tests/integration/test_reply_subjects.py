"""Reply subjects are never trusted: an agent's reply subjects reach its own account only.

Tried on the embedded nats-server with auth on (one stack for the module, agents `alice`
and `bob`) as a hostile agent would: alice publishes her own requests, feedback and
replay requests with reply subjects that name bob's subjects, the pipeline's and the
JetStream API. Neither JetStream's acknowledgement nor the gateway's replay service may
deliver anything there (before accounts, the acknowledgement was stored on bob's answer
subject and in bob's request queue)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats
import pytest
from nats.js.errors import NotFoundError

from services.gateway.replay_service import ReplayService
from shared.contracts import pipeline
from shared.contracts.codec import encode
from shared.contracts.response import STREAM as RESPONSES
from shared.contracts.response import ChunkKind, ResponseChunk
from tests.helpers.nats_auth import AuthStack, Recorded, auth_stack, connect_recording
from tests.helpers.nats_sync import flushed

pytestmark = pytest.mark.integration

# Where a hostile reply subject could land: bob's answers, bob's request queue and
# feedback, a stage of the pipeline, the JetStream API.
FOREIGN_REPLIES = [
    "agent.response.bob.victim",
    "agent.request.bob",
    "agent.feedback.bob",
    pipeline.CLASSIFY_SUBJECT,
    f"$JS.API.STREAM.PURGE.{RESPONSES}",
    f"$JS.API.STREAM.DELETE.{RESPONSES}",
]


@pytest.fixture(scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[AuthStack]:
    async with auth_stack(tmp_path_factory.mktemp("replies"), ("alice", "bob")) as running:
        yield running


@pytest.fixture
async def alice(stack: AuthStack) -> AsyncIterator[Recorded]:
    conn = await connect_recording(stack.nats_url, **stack.agent("alice"))
    yield conn
    await conn.nc.close()


@pytest.fixture
async def admin(stack: AuthStack) -> AsyncIterator[nats.NATS]:
    nc = await nats.connect(stack.nats_url, **stack.admin())
    yield nc
    await nc.close()


async def _stream_messages(admin: nats.NATS) -> dict[str, int]:
    js = admin.jetstream()
    names = ("AGENT_REQUESTS", "AGENT_FEEDBACK", RESPONSES, pipeline.STREAM)
    return {name: (await js.stream_info(name)).state.messages for name in names}


async def _nothing_for_bob(admin: nats.NATS) -> None:
    js = admin.jetstream()
    for stream, subject in (("AGENT_REQUESTS", "agent.request.bob"),
                            ("AGENT_FEEDBACK", "agent.feedback.bob"),
                            (RESPONSES, "agent.response.bob.victim"),
                            (pipeline.STREAM, pipeline.CLASSIFY_SUBJECT)):
        with pytest.raises(NotFoundError):
            await js.get_last_msg(stream, subject)


@pytest.mark.parametrize("own_subject", ["agent.request.alice", "agent.feedback.alice"])
async def test_jetstream_acknowledgements_never_reach_another_agent(
    stack: AuthStack, alice: Recorded, admin: nats.NATS, own_subject: str
) -> None:
    bob = await connect_recording(stack.nats_url, **stack.agent("bob"))
    live = await bob.nc.subscribe("agent.response.bob.>")
    await flushed(bob.nc)
    before = await _stream_messages(admin)
    for reply in FOREIGN_REPLIES:
        await alice.nc.publish(own_subject, b'{"request_id": "r1"}', reply=reply)
    await flushed(alice.nc)
    await asyncio.sleep(0.3)  # an acknowledgement is sent right after the store
    after = await _stream_messages(admin)
    # Alice's own messages are stored (one per publish), nothing else anywhere.
    own_stream = "AGENT_REQUESTS" if "request" in own_subject else "AGENT_FEEDBACK"
    assert after[own_stream] - before[own_stream] == len(FOREIGN_REPLIES)
    assert {k: after[k] - before[k] for k in after if k != own_stream} == {
        k: 0 for k in after if k != own_stream}
    await _nothing_for_bob(admin)
    with pytest.raises(nats.errors.TimeoutError):
        await live.next_msg(timeout=0.3)
    assert (await admin.jetstream().stream_info(RESPONSES)).config.name == RESPONSES  # kept
    await bob.nc.close()


async def test_an_agents_own_acknowledgement_still_comes_back(alice: Recorded) -> None:
    ack = await alice.nc.jetstream().publish("agent.request.alice", b'{"q": 1}',
                                             headers={"Nats-Msg-Id": "alice:own:1"})
    assert ack.stream == "AGENT_REQUESTS"


@pytest.fixture
async def replays(stack: AuthStack) -> AsyncIterator[ReplayService]:
    gateway = await nats.connect(stack.nats_url, **stack.service("gateway"))
    # Room for every replay a test sends at once: an agent's requests come through its
    # service import, so the foreign reply subjects below are mapped (`_R_.`) and served
    # too, into the asker's own account. With 4, the asker's own replay, sent last, was
    # refused CONCURRENCY_LIMITED when the six before it were still running (a full run).
    service = ReplayService(gateway, follow_for=5.0, concurrency=2 * len(FOREIGN_REPLIES))
    await service.start()
    await flushed(gateway)
    yield service
    await service.stop()
    await gateway.close()


async def test_a_replay_goes_to_the_askers_own_inbox_only(
    stack: AuthStack, alice: Recorded, admin: nats.NATS, replays: ReplayService
) -> None:
    # Alice's stored answer, as a stage would have stored it.
    final = ResponseChunk(request_id="r7", seq=0, text="alice's answer",
                          kind=ChunkKind.FINAL, is_final=True)
    await admin.jetstream().publish("agent.response.alice.r7", encode(final))
    bob = await connect_recording(stack.nats_url, **stack.agent("bob"))
    live = await bob.nc.subscribe("agent.response.bob.>")
    await flushed(bob.nc)
    before = await _stream_messages(admin)
    for reply in FOREIGN_REPLIES:
        await alice.nc.publish("agent.replay.alice", b"r7", reply=reply)
    # Her own inbox gets her answer.
    inbox = alice.nc.new_inbox()
    mine = await alice.nc.subscribe(inbox)
    await alice.nc.publish("agent.replay.alice", b"r7", reply=inbox)
    assert b"alice's answer" in (await mine.next_msg(timeout=5)).data
    await asyncio.sleep(0.3)
    assert await _stream_messages(admin) == before
    await _nothing_for_bob(admin)
    with pytest.raises(nats.errors.TimeoutError):
        await live.next_msg(timeout=0.3)
    await bob.nc.close()


async def test_a_replay_in_the_stacks_account_must_name_the_agents_inbox(
    stack: AuthStack, admin: nats.NATS, replays: ReplayService
) -> None:
    """A caller inside the stack's account (the admin) gets no replay on a subject that
    is not the agent's own inbox, and one on the agent's inbox."""
    final = ResponseChunk(request_id="r8", seq=0, text="x", kind=ChunkKind.FINAL,
                          is_final=True)
    await admin.jetstream().publish("agent.response.alice.r8", encode(final))
    sub = await admin.subscribe("agent.response.bob.forged")
    own = await admin.subscribe("_INBOX.alice.admin-asks")
    await flushed(admin)
    await admin.publish("agent.replay.alice", b"r8", reply="agent.response.bob.forged")
    await admin.publish("agent.replay.alice", b"r8", reply="_INBOX.alice.admin-asks")
    assert (await own.next_msg(timeout=5)).data
    with pytest.raises(nats.errors.TimeoutError):
        await sub.next_msg(timeout=0.3)


async def test_a_replay_past_the_services_room_is_told_to_ask_again(
    stack: AuthStack, alice: Recorded, admin: nats.NATS
) -> None:
    # One slot. A replay of an answer still in progress follows it and keeps the slot;
    # the next replay gets a typed final at once (CONCURRENCY_LIMITED, retry after 1 s),
    # not a wait, and the first still gets the answer's final once it is stored.
    gateway = await nats.connect(stack.nats_url, **stack.service("gateway"))
    service = ReplayService(gateway, follow_for=5.0, concurrency=1)
    await service.start()
    try:
        await flushed(gateway)
        await admin.jetstream().publish("agent.response.alice.r9", encode(ResponseChunk(
            request_id="r9", seq=0, text="half", kind=ChunkKind.TEXT)))
        first, second = alice.nc.new_inbox(), alice.nc.new_inbox()
        following = await alice.nc.subscribe(first)
        refused = await alice.nc.subscribe(second)
        await alice.nc.publish("agent.replay.alice", b"r9", reply=first)
        assert b"half" in (await following.next_msg(timeout=5)).data
        await alice.nc.publish("agent.replay.alice", b"r9", reply=second)
        answer = (await refused.next_msg(timeout=5)).data
        assert b'"CONCURRENCY_LIMITED"' in answer
        assert b'"retry_after_ms":1000' in answer
        await admin.jetstream().publish("agent.response.alice.r9", encode(ResponseChunk(
            request_id="r9", seq=1, text="whole", kind=ChunkKind.FINAL, is_final=True)))
        assert b"whole" in (await following.next_msg(timeout=5)).data
    finally:
        await service.stop()
        await gateway.close()
