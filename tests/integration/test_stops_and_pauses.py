"""Stops and pauses ridden out, with exact counts (issue 20): a replica SIGSTOPped with
deliveries in its buffer and resumed after its ack wait, a caller whose final was stored
while it was disconnected from a restarted nats-server, a Postgres paused under answers
that need no database, and a returning session that asks while Postgres is paused
(issue 32). Every request ends in exactly one final chunk seen live."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest

from bench.pg_pause import paused
from shared.auth.permissions import SERVICES_API, service_user
from shared.client.caller import ask, publish_request
from shared.contracts import pipeline, response
from shared.contracts.codec import decode_chunk
from shared.contracts.request import AgentRequest
from shared.contracts.response import ChunkKind
from shared.contracts.routing import QueryType
from shared.store.stores import Store
from tests.helpers.nats_sync import flushed
from tests.helpers.outage import AGENT, OwnStack, own_stack
from tests.helpers.pipeline import base_env, running, worker_env

pytestmark = pytest.mark.integration

ACK_WAIT = 2.0


@pytest.fixture(scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[OwnStack]:
    async with own_stack(tmp_path_factory.mktemp("stops")) as own:
        yield own


def env_for(stack: OwnStack, kb_index: Path, **extra: str) -> dict[str, str]:
    return base_env(stack.nats_url, stack.database_url, kb_index,
                    INTENTROUTE_HOME=str(stack.state_dir), STAGE_ACK_WAIT=str(ACK_WAIT),
                    GENERATOR_BACKEND="echo", **extra)


def platform_request(i: int, session: str = "") -> AgentRequest:
    return AgentRequest(request_id=uuid.uuid4().hex, session_id=session or f"sp-{i % 7}",
                        agent_id=AGENT, query="how many calls do I have left this month?",
                        extra_context=f"calls_used={i} monthly_calls=2000")


class LiveFinals:
    """Final chunks per request id, as a live subscriber of the agent's responses sees
    them (every message counted: an identical copy is a second final too)."""

    def __init__(self) -> None:
        self.finals: Counter[str] = Counter()

    async def on_chunk(self, msg: Any) -> None:
        chunk = decode_chunk(msg.data)
        if chunk.is_final:
            self.finals[chunk.request_id] += 1


async def replicas_answering(nc: Any, worker: str, count: int, timeout: float = 180) -> None:
    """Until `count` replicas of `worker` answer the services API's PING."""
    deadline = time.monotonic() + timeout
    while True:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish(f"{SERVICES_API}.PING.{service_user(worker)}", b"", reply=inbox)
        await asyncio.sleep(0.5)
        replies = sub.pending_msgs
        await sub.unsubscribe()
        if replies >= count:
            return
        assert time.monotonic() < deadline, f"{count} replicas of {worker} never answered"


async def test_a_replica_stopped_with_deliveries_in_its_buffer_answers_nothing_twice(
    stack: OwnStack, kb_index: Path
) -> None:
    """Replica B of the generator is SIGSTOPped; requests published meanwhile are
    partly delivered into its buffer, redelivered to replica A after the ack wait and
    answered there. B resumes 8 s later (4 ack waits) and handles what it held: each of
    those deliveries is its first, but the server stored it long ago, so its final goes
    through the answer claim and is not sent again."""
    # A takes 2 at a time (a pull of 2), B 16: most of the burst waits in B's buffer.
    env = env_for(stack, kb_index, GENERATOR_ECHO_DELAY="0.3", GENERATOR_CONCURRENCY="2")
    name = "generator-conversational"
    live = LiveFinals()
    requests = [platform_request(i) for i in range(40)]
    admin = await nats.connect(stack.nats_url, **stack.admin())
    nc = await stack.connect_agent()
    replica = subprocess.Popen(  # noqa: ASYNC220 - started once, not awaited
        [sys.executable, "-m", "intentroute.cli", "worker", name],
        env={**os.environ, **worker_env(env, name), "GENERATOR_CONCURRENCY": "16"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async with running(env, ("gateway", "classifier", name)):
            await replicas_answering(admin, name, 2)
            await nc.subscribe(response.agent_responses(AGENT), cb=live.on_chunk)
            await flushed(nc)
            js = admin.jetstream()
            before = (await js.consumer_info(pipeline.STREAM, name)).delivered.consumer_seq
            replica.send_signal(signal.SIGSTOP)
            try:
                for req in requests:
                    await publish_request(nc, req)
                await asyncio.sleep(8.0)
            finally:
                replica.send_signal(signal.SIGCONT)
            # Until every request has its final and B has settled what it held.
            for _ in range(240):
                info = await js.consumer_info(pipeline.STREAM, name)
                if (info.num_ack_pending == 0 and info.num_pending == 0
                        and all(live.finals[r.request_id] for r in requests)):
                    break
                await asyncio.sleep(0.25)
            await asyncio.sleep(1.5)  # a second final, if any, would arrive now
            # Deliveries (the consumer's sequence counts each one, redeliveries too).
            deliveries = (info.delivered.consumer_seq or 0) - (before or 0)
    finally:
        replica.terminate()
        replica.wait(30)
        await nc.close()
        await admin.close()
    # The stopped replica did hold deliveries, redelivered to A (else nothing was tested).
    assert deliveries > len(requests)
    assert {r.request_id: live.finals[r.request_id] for r in requests} == {
        r.request_id: 1 for r in requests}


async def test_a_caller_gets_the_final_stored_while_it_was_disconnected(
    stack: OwnStack, kb_index: Path
) -> None:
    """nats-server is killed while an answer is being made and started again on its
    port. The workers reconnect within a quarter second and the final chunk is published
    and stored; the caller reconnects only seconds later (its reconnect wait is 3 s), so
    its subscription never sees that final. `ask` replays what it missed after the
    reconnect: exactly one final, the answer's."""
    env = env_for(stack, kb_index, GENERATOR_ECHO_DELAY="1.5")
    reconnected: list[float] = []

    async def on_reconnect() -> None:
        reconnected.append(time.time())

    nc = await nats.connect(stack.nats_url, **stack.agent.nats, reconnect_time_wait=3.0,
                            max_reconnect_attempts=-1, reconnected_cb=on_reconnect)
    admin = None
    req = platform_request(0, session=f"rc-{uuid.uuid4().hex[:6]}")
    try:
        async with running(env, ("gateway", "classifier", "generator-conversational")):
            answer = asyncio.create_task(_chunks(nc, req))
            await asyncio.sleep(0.7)  # the generator is making the answer
            await asyncio.to_thread(stack.nats.kill)
            await asyncio.to_thread(stack.nats.start)
            chunks = await answer
            admin = await nats.connect(stack.nats_url, **stack.admin())
            stored = await admin.jetstream().get_last_msg(
                response.STREAM, response.response_subject(AGENT, req.request_id))
    finally:
        await nc.close()
        if admin is not None:
            await admin.close()
    finals = [c for c in chunks if c.is_final]
    assert len(finals) == 1
    assert finals[0].error is None
    assert finals[0].kind == ChunkKind.FINAL
    # The final was stored before the caller was back (else nothing was tested).
    assert stored.data is not None
    assert decode_chunk(stored.data).is_final
    assert stored.time is not None
    assert reconnected
    assert stored.time.timestamp() < reconnected[0]


async def _chunks(nc: Any, req: AgentRequest) -> list[Any]:
    return [c async for c in ask(nc, req, timeout=60)]


def stopped(pid: int) -> bool:
    """Is the process stopped (SIGSTOP) right now?"""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


async def test_a_postgres_pause_holds_back_no_answer_that_needs_no_database(
    stack: OwnStack, kb_index: Path
) -> None:
    """Postgres (every process of it) is SIGSTOPped for ~6 s: RETRIEVAL questions on new
    sessions (no history to read) are answered while it is stopped, their rows queued
    on the bus; once it is back, every row is written, none twice."""
    workers = ("gateway", "classifier", "retriever", "generator-main")
    nc = await stack.connect_agent()

    def retrieval() -> AgentRequest:
        return AgentRequest(request_id=uuid.uuid4().hex, session_id=uuid.uuid4().hex[:12],
                            agent_id=AGENT, query="What does addParam do?",
                            query_type="RETRIEVAL")

    answered_paused: list[bool] = []
    requests = [retrieval() for _ in range(8)]
    try:
        async with running(env_for(stack, kb_index), workers):
            warm = await _chunks(nc, retrieval())
            assert warm[-1].error is None
            assert stack.pg.proc is not None
            with paused(stack.pg.proc.pid):
                await asyncio.sleep(0.3)
                for req in requests:
                    chunks = await _chunks(nc, req)
                    assert chunks[-1].is_final
                    assert chunks[-1].error is None
                    answered_paused.append(stopped(stack.pg.proc.pid))
                    if len(answered_paused) == 4:
                        # Past the probe (Postgres tried again) and past the gateway's
                        # agent cache (5 s since the warm-up: read again, not answered).
                        await asyncio.sleep(4.5)
            ids = [r.request_id for r in requests]
            counts = await _rows_written(stack.database_url, ids)
    finally:
        await nc.close()
    assert answered_paused == [True] * len(requests)
    assert counts == {"request_log": len(ids), "classify_history": len(ids),
                      "messages": 2 * len(ids)}


async def _rows_written(database_url: str, ids: list[str]) -> dict[str, int]:
    """The rows of `ids` once the row writer has written them all (or after 30 s)."""
    store = await Store.connect(database_url)
    try:
        for _ in range(120):
            counts = await _row_counts(store, ids)
            if min(counts.values()) == len(ids):
                break
            await asyncio.sleep(0.25)
        return counts
    finally:
        await store.close()


async def _row_counts(store: Store, ids: list[str]) -> dict[str, int]:
    counts = {}
    for table in ("request_log", "classify_history", "messages"):
        counts[table] = await store.pool.fetchval(
            f"SELECT count(*) FROM {table} WHERE agent_id = $1 "
            "AND request_id = ANY($2::text[])", AGENT, ids)
    return counts


async def test_a_returning_session_is_answered_through_a_postgres_pause(
    stack: OwnStack, kb_index: Path
) -> None:
    """Issue 32: a session with turns in Postgres asks while Postgres (every process of
    it) is SIGSTOPped: a rephrase (it reads the previous answer) and a deictic follow-up
    (the classifier reads the intent history) are answered while it is stopped, each
    within its read's bound, their decisions marked `history_unavailable`; a rephrase
    after them reads the previous answer from the session's queued rows (not marked).
    Once Postgres is back every row is written, none twice."""
    workers = ("gateway", "classifier", "retriever", "generator-main",
               "generator-conversational")
    nc = await stack.connect_agent()
    session = f"ret-{uuid.uuid4().hex[:8]}"

    def asked(query: str) -> AgentRequest:
        return AgentRequest(request_id=uuid.uuid4().hex, session_id=session,
                            agent_id=AGENT, query=query)

    warm = [asked("What does addParam do?"), asked("say that in fewer words")]
    during = [asked("say that in fewer words"), asked("and how do I use it?"),
              asked("What does addParam do?"), asked("say that in fewer words")]
    finals = []
    try:
        async with running(env_for(stack, kb_index), workers):
            for req in warm:  # the session's turns, in Postgres
                assert (await _chunks(nc, req))[-1].error is None
            assert stack.pg.proc is not None
            with paused(stack.pg.proc.pid):
                await asyncio.sleep(0.3)
                for req in during:
                    chunks = await _chunks(nc, req)
                    assert stopped(stack.pg.proc.pid)
                    finals.append(chunks[-1])
            ids = [r.request_id for r in warm + during]
            counts = await _rows_written(stack.database_url, ids)
    finally:
        await nc.close()
    assert [f.is_final and f.error is None for f in finals] == [True] * len(during)
    # Each was answered while Postgres stayed stopped (asserted above), so none waited
    # for the pause to end; what they waited (a read's bound and a row write's, 0.25 s
    # each) is bench pg-pause's to measure.
    assert finals[0].decision.type == finals[3].decision.type == QueryType.CONVERSATIONAL
    # The rephrase and the follow-up could not read the session; the last rephrase read
    # the previous answer from the rows queued for Postgres.
    assert [f.decision.history_unavailable for f in finals] == [True, True, False, False]
    assert counts == {"request_log": len(ids), "classify_history": len(ids),
                      "messages": 2 * len(ids)}
