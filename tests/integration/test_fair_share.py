"""The gateway's fair share on real servers: per-agent consumers replace the catch-all one,
a flood does not queue another agent's request behind it, weights share admissions, and
two replicas answer every request exactly once."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig

from shared.contracts.codec import decode_chunk, encode
from shared.contracts.request import STREAM, SUBJECTS, request_subject
from shared.store.policies import update_policy
from tests.helpers.agents import add_agents
from tests.helpers.pipeline import base_env, make_request, running

pytestmark = pytest.mark.integration

WORKERS = ("gateway", "classifier", "generator-conversational")


def _platform(agent: str, i: int) -> bytes:
    # A PLATFORM question (rules decide it): the cheap path, answered extractively.
    return encode(make_request(f"how many calls do I have left? ({i})", agent_id=agent,
                               extra_context=f"calls_used={i} monthly_calls=2000"))


class Finals:
    """Final chunks in the order they arrive, as (agent, request id)."""

    def __init__(self, *agents: str) -> None:
        self.agents = set(agents)  # others' answers (earlier tests' leftovers) not counted
        self.order: list[tuple[str, str]] = []
        self.arrived = asyncio.Event()

    async def on_chunk(self, msg: Msg) -> None:
        chunk = decode_chunk(msg.data)
        if chunk.is_final and msg.subject.split(".")[2] in self.agents:
            self.order.append((msg.subject.split(".")[2], chunk.request_id))
            self.arrived.set()

    async def wait_for(self, count: int, timeout: float = 90.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.order) < count:
                self.arrived.clear()
                await self.arrived.wait()


async def _queue(nc: Client, agent: str, n: int, start: int = 0) -> None:
    js = nc.jetstream()
    await asyncio.gather(*(js.publish(request_subject(agent), _platform(agent, i))
                           for i in range(start, start + n)))


async def _consumers(admin: Client) -> set[str]:
    return {c.name or "" for c in await admin.jetstream().consumers_info(STREAM)}


async def test_a_flood_does_not_queue_another_agents_request_behind_it(
    admin_nc: Client, nats_url: str, database_url: str, kb_index: Path,
) -> None:
    creds = await add_agents(nats_url, database_url, {"flood-a": False, "victim-b": False})
    # The catch-all consumer of before, as an old gateway left it (the session's server
    # may hold per-agent consumers of earlier tests' gateways: an old stack had none).
    for name in await _consumers(admin_nc):
        await admin_nc.jetstream().delete_consumer(STREAM, name)
    # Requests earlier tests left unanswered on purpose (no gateway ran) are not A's or B's.
    await admin_nc.jetstream().purge_stream(STREAM)
    await admin_nc.jetstream().add_consumer(STREAM, ConsumerConfig(
        name="gateway", durable_name="gateway", filter_subject=SUBJECTS,
        ack_policy=AckPolicy.EXPLICIT))
    import nats

    flood = await nats.connect(nats_url, **creds["flood-a"].nats)
    victim = await nats.connect(nats_url, **creds["victim-b"].nats)
    finals = Finals("flood-a", "victim-b")
    sub = await admin_nc.subscribe("agent.response.*.*", cb=finals.on_chunk)
    try:
        # A's backlog of 400 is queued first, B's one request after all of it.
        await _queue(flood, "flood-a", 400)
        await _queue(victim, "victim-b", 1)
        env = base_env(nats_url, database_url, kb_index, CLASSIFIER_HEADS_DIR="",
                       GATEWAY_PIPELINE_BACKLOG="8")
        async with running(env, WORKERS):
            await finals.wait_for(401)
            consumers = await _consumers(admin_nc)
    finally:
        await sub.unsubscribe()
        await flood.drain()
        await victim.drain()
    assert "gateway" not in consumers  # the catch-all is gone...
    assert {"gateway-flood-a", "gateway-victim-b"} <= consumers  # ...one per agent
    agents = [agent for agent, _ in finals.order]
    assert Counter(agents) == {"flood-a": 400, "victim-b": 1}
    # FIFO would answer B 401st. Taken in turns, B's request goes within the first
    # round: at most one quantum of A's, plus what the pipeline's bound already held.
    assert agents.index("victim-b") < 20, agents.index("victim-b")


async def test_weights_share_admissions_and_two_replicas_answer_each_request_once(
    admin_nc: Client, nats_url: str, database_url: str, kb_index: Path, store: Any,
) -> None:
    creds = await add_agents(nats_url, database_url, {"heavy": False, "light": False})
    await update_policy(store.pool, "heavy", ["weight=2"])
    import nats

    heavy = await nats.connect(nats_url, **creds["heavy"].nats)
    light = await nats.connect(nats_url, **creds["light"].nats)
    finals = Finals("heavy", "light")
    sub = await admin_nc.subscribe("agent.response.*.*", cb=finals.on_chunk)
    try:
        await _queue(heavy, "heavy", 300)
        await _queue(light, "light", 300)
        env = base_env(nats_url, database_url, kb_index, CLASSIFIER_HEADS_DIR="",
                       GATEWAY_PIPELINE_BACKLOG="6", GATEWAY_FAIR_QUANTUM="2")
        async with running(env, ("gateway", *WORKERS)):  # two gateway replicas
            await finals.wait_for(600)
            await asyncio.sleep(1.0)  # a duplicate final would arrive meanwhile
    finally:
        await sub.unsubscribe()
        await heavy.drain()
        await light.drain()
    # Every request answered exactly once across the two replicas.
    assert len(finals.order) == 600
    assert len(set(finals.order)) == 600
    # While both still had a backlog (the first 300 answers: heavy had not run out),
    # heavy got about twice light's share.
    window = Counter(agent for agent, _ in finals.order[:300])
    assert window["heavy"] / window["light"] == pytest.approx(2.0, rel=0.25), window
