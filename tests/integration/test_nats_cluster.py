"""A three-node NATS cluster on loopback (real nats-servers, authentication on, every
stream with 3 replicas): a request is answered through it; a node killed with SIGKILL
mid-load loses nothing (every request sent is answered, its answer stored with exactly
one final chunk, no error; every answered turn has its request-log row), and the node,
restarted, catches up."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import nats
import pytest
from nats.aio.msg import Msg

from intentroute.stack import NatsCluster
from intentroute.stack.nats_users import admin_kwargs, auth_files, sync_agents
from intentroute.stack.replication import Replicated, leaders, wait_until
from shared.auth.natsconn import Credential
from shared.client.caller import ask, publish_until_stored
from shared.common.settings import nats_servers
from shared.contracts import deadletter, pipeline, request, response
from shared.contracts.codec import decode_chunk
from shared.contracts.request import AgentRequest
from shared.contracts.response import agent_responses
from shared.runtime.consumer import agent_consumer_name
from shared.runtime.streams import ensure_streams
from shared.store import asyncpg_dsn
from shared.store.agents import AgentStore
from tests.helpers.agents import wait_admitted
from tests.helpers.pipeline import base_env, running

pytestmark = pytest.mark.integration

AGENT = "cluster-agent"
WORKERS = ("gateway", "classifier", "generator-conversational")
STREAMS = [Replicated(s) for s in (request.STREAM, pipeline.STREAM, response.STREAM,
                                   deadletter.STREAM)]
# The gateway reads each agent's requests through that agent's own consumer.
CONSUMERS = [Replicated(request.STREAM, agent_consumer_name("gateway", AGENT)),
             Replicated(pipeline.STREAM, "classifier"),
             Replicated(pipeline.STREAM, "generator-conversational")]


@dataclass
class Cluster:
    state_dir: Path
    nats: NatsCluster
    database_url: str
    agent: Credential

    @property
    def url(self) -> str:
        return self.nats.url

    async def admin(self) -> Any:
        return await nats.connect(nats_servers(self.url), **admin_kwargs(self.state_dir),
                                  reconnect_time_wait=0.1, max_reconnect_attempts=-1)

    async def caller(self) -> Any:
        return await nats.connect(nats_servers(self.url), **self.agent.nats,
                                  reconnect_time_wait=0.1, max_reconnect_attempts=-1)

    def env(self, tmp: Path) -> dict[str, str]:
        return base_env(self.url, self.database_url, tmp / "no-index",
                        INTENTROUTE_HOME=str(self.state_dir), NATS_STREAM_REPLICAS="3")


@pytest.fixture(scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory, database_url: str
                  ) -> AsyncIterator[Cluster]:
    state_dir = tmp_path_factory.mktemp("cluster")
    nodes = NatsCluster(state_dir / "nats", 3, creds_dir=auth_files(state_dir).creds_dir)
    nodes.start()
    try:
        store = await AgentStore.connect(database_url)
        try:
            if await store.get(AGENT) is not None:  # a reused external database
                cred = await store.rotate(AGENT)
            else:
                cred = await store.add(AGENT)
        finally:
            await store.close()
        await sync_agents(state_dir, database_url)  # reloads every node
        for node in nodes.nodes:
            await wait_admitted(node.url, cred)
        own = Cluster(state_dir, nodes, database_url, cred)
        admin = await own.admin()
        try:
            await ensure_streams(admin.jetstream(), 3600, replicas=3)
        finally:
            await admin.close()
        yield own
    finally:
        nodes.stop()


def platform_request(i: int) -> AgentRequest:
    return AgentRequest(request_id=uuid.uuid4().hex, session_id=f"c-{i % 7}", agent_id=AGENT,
                        query="how many calls do I have left this month?",
                        extra_context=f"calls_used={i} monthly_calls=2000")


async def test_a_request_through_a_three_node_cluster_is_answered(
    cluster: Cluster, tmp_path: Path
) -> None:
    admin = await cluster.admin()
    try:
        info = await admin.jetstream().stream_info(pipeline.STREAM)
    finally:
        await admin.close()
    assert info.config.num_replicas == 3
    assert info.cluster is not None
    assert len(info.cluster.replicas or []) == 2  # and the leader
    nc = await cluster.caller()
    try:
        async with running(cluster.env(tmp_path), WORKERS):
            chunks = [c async for c in ask(nc, platform_request(0), timeout=30)]
    finally:
        await nc.close()
    assert [c.is_final for c in chunks].count(True) == 1
    assert chunks[-1].is_final
    assert chunks[-1].error is None


async def stored_finals(admin: Any) -> Counter[str]:
    """Final chunks per request as the response stream stored them."""
    sub = await admin.jetstream().subscribe(agent_responses(AGENT), ordered_consumer=True)
    counts: Counter[str] = Counter()
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except nats.errors.TimeoutError:
                return counts
            chunk = decode_chunk(msg.data)
            if chunk.is_final:
                counts[chunk.request_id] += 1
    finally:
        await sub.unsubscribe()


async def test_a_node_killed_mid_load_loses_nothing_and_catches_up_when_restarted(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Every final message the caller receives live, per request.
    finals: dict[str, list[bytes]] = defaultdict(list)
    errors: list[str] = []
    requests = [platform_request(i) for i in range(150)]
    all_answered = asyncio.Event()

    async def on_chunk(msg: Msg) -> None:
        chunk = decode_chunk(msg.data)
        if chunk.is_final:
            finals[chunk.request_id].append(msg.data)
            if chunk.error is not None:
                errors.append(chunk.error.code)
            if len(finals) == len(requests):
                all_answered.set()

    admin = await cluster.admin()
    nc = await cluster.caller()
    await nc.subscribe(agent_responses(AGENT), cb=on_chunk)
    try:
        async with running(cluster.env(tmp_path), WORKERS):
            # The node that leads the pipeline: every hand-off waits for its successor.
            victim = (await leaders(admin.jetstream(), [Replicated(pipeline.STREAM)]))[
                pipeline.STREAM]
            assert victim
            # Leaders are re-elected in seconds here, but on a loaded machine it takes
            # longer: wait as long as the requests may live (REQUEST_DEADLINE 120 s).
            deadline = time.monotonic() + 110
            sends = []
            for i, req in enumerate(requests):
                sends.append(asyncio.create_task(
                    publish_until_stored(nc, req, give_up_at=deadline)))
                if i == 40:
                    cluster.nats.node(victim).kill()
                await asyncio.sleep(1 / 40)
            await asyncio.gather(*sends)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_answered.wait(), deadline - time.monotonic())
            await asyncio.sleep(1.0)  # a second answer would arrive now
            answers = {rid: set(payloads) for rid, payloads in finals.items()}
            cluster.nats.node(victim).start()
            # Raises TimeoutError if the restarted node never catches up.
            await wait_until(admin.jetstream(), STREAMS + CONSUMERS, victim,
                             caught_up=True, timeout=90)
            stored = await stored_finals(admin)
    finally:
        await nc.close()
        await admin.close()
    # Every request answered live, and stored with exactly one final chunk. (Live, a
    # final whose ack was lost is re-sent as it was; a request whose consumer's leader
    # was elected anew can also be redelivered to a second replica while the first,
    # cut off, still answers it: README, Reliability.)
    assert len(answers) == len(requests)
    assert errors == []
    ids = [r.request_id for r in requests]
    assert {rid: stored[rid] for rid in ids} == dict.fromkeys(ids, 1)
    conn = await asyncpg.connect(asyncpg_dsn(cluster.database_url))
    try:
        logged = await conn.fetchval(
            "SELECT count(*) FROM request_log WHERE agent_id = $1 AND outcome = 'ok' "
            "AND request_id = ANY($2::text[])", AGENT, ids)
    finally:
        await conn.close()
    assert logged == len(requests)
