"""The embedded nats-server with auth on: each forbidden action is tried and refused.

One stack for the module, agents `alice` and `bob`, streams of the agent-scoped
subject scheme (agent.request.<agent>, agent.response.<agent>.<request>)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from intentroute.stack import nats_server_binary
from intentroute.stack.nats_users import auth_files
from shared.auth.permissions import STREAM_SUBJECTS
from shared.contracts import pipeline
from shared.contracts.response import STREAM as RESPONSES
from shared.runtime.consumer import StageConsumer, StageSpec, ensure_consumer
from tests.helpers.nats_auth import (
    AuthStack,
    Recorded,
    assert_no_refusal,
    assert_publish_refused,
    assert_subscribe_refused,
    auth_stack,
    connect_recording,
)
from tests.helpers.nats_sync import flushed

pytestmark = pytest.mark.integration

STAGE_SUBJECTS = [
    pipeline.CLASSIFY_SUBJECT,
    pipeline.RETRIEVE_SUBJECT,
    f"{pipeline.GENERATE_SUBJECT_PREFIX}.main",
    f"{pipeline.GENERATE_SUBJECT_PREFIX}.conversational",
    pipeline.VALIDATE_SUBJECT,
]


@pytest.fixture(scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[AuthStack]:
    async with auth_stack(tmp_path_factory.mktemp("auth"), ("alice", "bob")) as running:
        yield running


@pytest.fixture
async def alice(stack: AuthStack) -> AsyncIterator[Recorded]:
    conn = await connect_recording(stack.nats_url, **stack.agent("alice"))
    yield conn
    await conn.nc.close()


def test_rendered_config_passes_the_servers_own_check(stack: AuthStack) -> None:
    files = auth_files(stack.state_dir)
    res = subprocess.run([nats_server_binary(), "-t", "-c", str(files.config)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr + res.stdout
    assert files.config.stat().st_mode & 0o777 == 0o600
    assert files.auth.stat().st_mode & 0o777 == 0o600
    assert files.creds_dir.stat().st_mode & 0o777 == 0o700
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in files.creds_dir.glob("*.json"))


async def test_anonymous_connection_is_refused(stack: AuthStack) -> None:
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(stack.nats_url, allow_reconnect=False, max_reconnect_attempts=0)


@pytest.mark.parametrize("user", ["alice", "admin", "intentroute-gateway"])
async def test_a_wrong_password_is_refused(stack: AuthStack, user: str) -> None:
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(stack.nats_url, user=user, password="not-the-secret",
                           allow_reconnect=False, max_reconnect_attempts=0)


@pytest.mark.parametrize(
    "subject", ["agent.response.>", "agent.response.bob.x", "agent.response.*.x", ">",
                "_INBOX.bob.>", "_INBOX.>", "intentroute.stage.>", "agent.request.*"],
)
async def test_an_agent_cannot_subscribe_beyond_its_own_answers(
    alice: Recorded, subject: str
) -> None:
    await assert_subscribe_refused(alice, subject)


@pytest.mark.parametrize("subject", ["agent.request.bob", "agent.feedback.bob",
                                     "agent.response.bob.r1", "intentroute.invalid",
                                     *STAGE_SUBJECTS])
async def test_an_agent_cannot_publish_another_agents_or_internal_subjects(
    alice: Recorded, subject: str
) -> None:
    await assert_publish_refused(alice, subject)


@pytest.mark.parametrize(
    "subject",
    ["$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST", "$JS.API.INFO",
     f"$JS.API.STREAM.INFO.{RESPONSES}", f"$JS.API.STREAM.DELETE.{RESPONSES}",
     f"$JS.API.STREAM.PURGE.{RESPONSES}", f"$JS.API.STREAM.MSG.GET.{RESPONSES}",
     f"$JS.API.DIRECT.GET.{RESPONSES}.agent.response.bob.r1", f"$JS.API.CONSUMER.LIST.{RESPONSES}",
     f"$JS.API.CONSUMER.CREATE.{RESPONSES}", f"$JS.API.CONSUMER.CREATE.{RESPONSES}.x",
     f"$JS.API.CONSUMER.DURABLE.CREATE.{RESPONSES}.x"],
)
async def test_an_agent_has_no_other_jetstream_api(alice: Recorded, subject: str) -> None:
    await assert_publish_refused(alice, subject)


async def test_an_agent_cannot_list_streams(alice: Recorded) -> None:
    js = alice.nc.jetstream(timeout=1)
    since = len(alice.errors)
    with pytest.raises(nats.errors.TimeoutError):
        await js.streams_info()
    assert await alice.wait_refusal('publish to "$js.api.stream.list"', since)


@pytest.mark.parametrize("kind", ["durable", "push", "ordered", "other-agent"])
async def test_an_agents_consumer_creation_is_refused(alice: Recorded, kind: str) -> None:
    """No consumer of its own at all, even on its own answers: a durable one never
    expires, a push one delivers wherever its body says (late replay is the gateway's,
    tests/integration/test_bounds.py)."""
    js = alice.nc.jetstream(timeout=2)
    since = len(alice.errors)
    name = f"peek-{uuid.uuid4().hex[:8]}"
    own = "agent.response.alice.>"
    attempts: dict[str, Callable[[], Awaitable[Any]]] = {
        "durable": lambda: js.add_consumer(RESPONSES, config=ConsumerConfig(
            durable_name=name, filter_subject=own, ack_policy=AckPolicy.EXPLICIT)),
        "push": lambda: js.add_consumer(RESPONSES, config=ConsumerConfig(
            name=name, filter_subject=own, deliver_subject="agent.request.alice",
            ack_policy=AckPolicy.NONE)),
        "ordered": lambda: js.subscribe(own, stream=RESPONSES, ordered_consumer=True,
                                        deliver_policy=DeliverPolicy.ALL),
        "other-agent": lambda: js.add_consumer(RESPONSES, config=ConsumerConfig(
            name=name, filter_subject="agent.response.bob.>",
            deliver_subject=alice.nc.new_inbox(), ack_policy=AckPolicy.NONE)),
    }
    with pytest.raises(nats.errors.TimeoutError):
        await attempts[kind]()
    assert await alice.wait_refusal('publish to "$js.api.consumer.', since)


async def test_an_agent_publishes_its_requests_and_replay_requests(
    stack: AuthStack, alice: Recorded
) -> None:
    ack = await alice.nc.jetstream().publish("agent.request.alice", b'{"q": 1}')
    assert ack.stream == "AGENT_REQUESTS"
    since = len(alice.errors)
    await alice.nc.publish("agent.replay.alice", b"r1", reply=alice.nc.new_inbox())
    await alice.nc.flush()
    await assert_no_refusal(alice, since)
    await assert_publish_refused(alice, "agent.replay.bob", b"r1")


async def test_an_agent_receives_its_live_answer(stack: AuthStack, alice: Recorded) -> None:
    sub = await alice.nc.subscribe("agent.response.alice.>")
    await flushed(alice.nc)
    worker = await connect_recording(stack.nats_url, **stack.service("classifier"))
    await worker.nc.publish("agent.response.alice.r9", b"live")
    await worker.nc.flush()
    assert (await sub.next_msg(timeout=5)).data == b"live"
    await assert_no_refusal(worker, 0)
    await worker.nc.close()


@pytest.mark.parametrize(
    ("worker", "subject"),
    [("retriever", pipeline.VALIDATE_SUBJECT), ("retriever", pipeline.CLASSIFY_SUBJECT),
     ("classifier", pipeline.VALIDATE_SUBJECT), ("generator-conversational",
                                                 pipeline.VALIDATE_SUBJECT),
     # a part's ending stage may hand the next part to the retriever (NEXT_PART), never
     # a message back to the classifier
     ("generator-main", pipeline.CLASSIFY_SUBJECT), ("validator", pipeline.CLASSIFY_SUBJECT),
     ("classifier", "agent.request.alice"), ("gateway", pipeline.RETRIEVE_SUBJECT),
     ("retriever", f"$JS.API.STREAM.CREATE.{RESPONSES}"),
     ("gateway", f"$JS.API.STREAM.UPDATE.{RESPONSES}"),
     ("validator", f"$JS.API.STREAM.DELETE.{RESPONSES}"),
     ("classifier", "$JS.API.CONSUMER.CREATE.INTENTROUTE_PIPELINE.retriever."
                    "intentroute.stage.retrieve"),
     ("classifier", "intentroute.dlq.retriever"),
     ("retriever", "_INBOX.alice.x")],
)
async def test_a_service_user_cannot_act_outside_its_stage(
    stack: AuthStack, worker: str, subject: str
) -> None:
    conn = await connect_recording(stack.nats_url, **stack.service(worker))
    try:
        await assert_publish_refused(conn, subject)
    finally:
        await conn.nc.close()


@pytest.mark.parametrize(("worker", "subject"),
                         [("classifier", "agent.response.>"), ("retriever", "_INBOX.admin.>"),
                          ("validator", "intentroute.stage.>")])
async def test_a_service_user_cannot_subscribe_outside_its_stage(
    stack: AuthStack, worker: str, subject: str
) -> None:
    conn = await connect_recording(stack.nats_url, **stack.service(worker))
    try:
        await assert_subscribe_refused(conn, subject)
    finally:
        await conn.nc.close()


async def test_a_service_user_runs_its_durable_stage_consumer(stack: AuthStack) -> None:
    """The retriever's user creates its durable, pulls, acks and hands off: the
    subjects nats-py uses are the ones the matrix grants."""
    conn = await connect_recording(stack.nats_url, **stack.service("retriever"))
    admin = await nats.connect(stack.nats_url, **stack.admin())
    spec = StageSpec(stream=pipeline.STREAM, subject=pipeline.RETRIEVE_SUBJECT,
                     durable="retriever", max_inflight=4, ack_wait=5, max_deliver=2)
    received: asyncio.Queue[bytes] = asyncio.Queue()
    js = conn.nc.jetstream()

    async def handle(msg: Any) -> None:  # StageConsumer hands a JetStream delivery
        await js.publish(pipeline.generate_subject("main"), msg.data)
        await received.put(msg.data)

    for name in STREAM_SUBJECTS:  # what a worker with a credential checks at start
        await js.stream_info(name)
    await ensure_consumer(js, spec)
    consumer = StageConsumer(conn.nc, spec, handle)
    await consumer.start()
    try:
        await admin.jetstream().publish(pipeline.RETRIEVE_SUBJECT, b"envelope")
        assert await asyncio.wait_for(received.get(), 5) == b"envelope"
        await asyncio.sleep(0.2)  # the ack goes out after the handler returns
        info = await admin.jetstream().consumer_info(pipeline.STREAM, "retriever")
        assert info.num_ack_pending == 0
        await assert_no_refusal(conn, 0)
    finally:
        await consumer.stop()
        await conn.nc.close()
        await admin.drain()


async def test_a_generator_reads_the_last_stored_chunk(stack: AuthStack) -> None:
    conn = await connect_recording(stack.nats_url, **stack.service("generator-conversational"))
    js = conn.nc.jetstream()
    await js.publish("agent.response.bob.r42", b"last")
    msg = await js.get_last_msg(RESPONSES, "agent.response.bob.r42", direct=True)
    assert msg.data == b"last"
    await assert_no_refusal(conn, 0)
    await conn.nc.close()


@pytest.mark.parametrize("worker", ["classifier", "validator", "generator-conversational",
                                    "retriever", "generator-main", "gateway"])
async def test_no_worker_reads_agents_answers_by_sequence(stack: AuthStack, worker: str) -> None:
    """A worker names the answer it reads (last message of one subject); reading
    AGENT_RESPONSES, ANSWER_CLAIMS or the queued turn rows by sequence is refused."""
    conn = await connect_recording(stack.nats_url, **stack.service(worker))
    try:
        for stream in (RESPONSES, "ANSWER_CLAIMS", "TURN_ROWS"):
            await assert_publish_refused(conn, f"$JS.API.STREAM.MSG.GET.{stream}",
                                         b'{"seq": 1}')
            await assert_publish_refused(conn, f"$JS.API.DIRECT.GET.{stream}", b'{"seq": 1}')
    finally:
        await conn.nc.close()


def test_state_files_hold_no_plain_secret_of_an_agent(stack: AuthStack) -> None:
    secret = stack.agents["alice"].nats["password"]
    for path in Path(stack.state_dir).rglob("*"):
        if path.is_file() and path.suffix in (".conf", ".json", ".log"):
            assert secret not in path.read_text(errors="replace"), path


@pytest.mark.parametrize("target", [pipeline.CLASSIFY_SUBJECT, "agent.request.bob",
                                    "agent.request.alice", "agent.feedback.alice",
                                    "intentroute.claim.alice.x.1", "agent.response.bob.r1"])
async def test_an_agents_push_consumer_cannot_feed_the_pipeline(
    stack: AuthStack, alice: Recorded, target: str
) -> None:
    """The deliver subject of a consumer is in the request body, out of reach of subject
    permissions (the hostile test stored an agent's chunks in four streams this way):
    an agent may create no consumer, so nothing is delivered or stored anywhere."""
    worker = await connect_recording(stack.nats_url, **stack.service("classifier"))
    await worker.nc.jetstream().publish("agent.response.alice.seed", b"seed")
    await worker.nc.close()
    admin = await nats.connect(stack.nats_url, **stack.admin())
    js = admin.jetstream()
    before = {name: (await js.stream_info(name)).state.messages for name in STREAM_SUBJECTS}
    name = f"inject-{uuid.uuid4().hex[:8]}"
    since = len(alice.errors)
    with pytest.raises(nats.errors.TimeoutError):
        await alice.nc.jetstream(timeout=2).add_consumer(RESPONSES, config=ConsumerConfig(
            name=name, filter_subject="agent.response.alice.>", deliver_subject=target,
            ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL))
    assert await alice.wait_refusal('publish to "$js.api.consumer.create', since)
    await asyncio.sleep(1.0)
    after = {name: (await js.stream_info(name)).state.messages for name in STREAM_SUBJECTS}
    assert after == before
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await js.delete_consumer(RESPONSES, name)
    await admin.drain()
