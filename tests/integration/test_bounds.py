"""Bounded resources (real NATS with auth on, real Postgres): a full request stream
refuses the publish where the caller sees it, per agent and for everyone; a stack
declared before gets the limits on its next start; a late replay is the gateway's and
reads the asker's own answers only; an agent's sessions are capped, the least recently
used expiring."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from nats.js.api import DiscardPolicy

from shared.client.caller import AnswerTimeoutError, RequestRefusedError, publish_request, replay
from shared.common.limits import StreamLimits
from shared.contracts import request as request_contract
from shared.contracts import response as response_contract
from shared.contracts.codec import encode
from shared.contracts.response import ChunkKind, ErrorCode, ResponseChunk, response_subject
from shared.runtime.streams import ensure_streams
from shared.store import asyncpg_dsn, migrate
from shared.store.owner_settings import OwnerSettings
from shared.store.rows import TurnRow
from shared.store.stores import Store
from tests.helpers.agents import Connections, add_agents
from tests.helpers.databases import fresh_database
from tests.helpers.pipeline import base_env, make_request, running

pytestmark = pytest.mark.integration

FLOODER, NEIGHBOUR = "bounds-a", "bounds-b"


@pytest.fixture(scope="module")
async def bound_agents(stack: tuple[str, str]) -> dict[str, Any]:
    return await add_agents(*stack, {FLOODER: False, NEIGHBOUR: False})


@pytest.fixture
async def connect_bound(nats_url: str, bound_agents: dict[str, Any]) -> AsyncIterator[Any]:
    connect = Connections(nats_url, bound_agents)
    yield connect
    await connect.close()


@pytest.fixture
async def small_request_stream(admin_nc: Any) -> AsyncIterator[StreamLimits]:
    """AGENT_REQUESTS (declared at the session's start with the defaults) redeclared as
    `up` does on a restart with small limits; the defaults are put back after, and the
    test agents' waiting requests purged."""
    js = admin_nc.jetstream()
    waiting = (await js.stream_info(request_contract.STREAM)).state.messages
    limits = StreamLimits(per_agent=3, max_msgs=waiting + 4)
    await ensure_streams(js, 3600, limits=limits)
    try:
        yield limits
    finally:
        for agent in (FLOODER, NEIGHBOUR):
            await js.purge_stream(request_contract.STREAM,
                                  subject=request_contract.request_subject(agent))
        await ensure_streams(js, 3600)


async def test_a_full_request_stream_refuses_the_publish_where_the_caller_sees_it(
    admin_nc: Any, connect_bound: Any, small_request_stream: StreamLimits,
) -> None:
    info = await admin_nc.jetstream().stream_info(request_contract.STREAM)
    # The running stream took the new limits (ensure_streams updates a declared one).
    assert (info.config.max_msgs_per_subject, info.config.discard,
            info.config.discard_new_per_subject) == (3, DiscardPolicy.NEW, True)
    flooder, neighbour = await connect_bound(FLOODER), await connect_bound(NEIGHBOUR)
    # No gateway runs: every request waits in the stream.
    for _ in range(3):
        await publish_request(flooder, make_request("q", agent_id=FLOODER))
    with pytest.raises(RequestRefusedError, match="per subject"):
        await publish_request(flooder, make_request("one too many", agent_id=FLOODER))
    # The flooder's backlog does not refuse another agent...
    await publish_request(neighbour, make_request("mine", agent_id=NEIGHBOUR))
    # ... until the stream as a whole is full: then everyone is refused, visibly, and
    # nothing queued was dropped to make room.
    with pytest.raises(RequestRefusedError, match="maximum messages"):
        await publish_request(neighbour, make_request("late", agent_id=NEIGHBOUR))
    after = await admin_nc.jetstream().stream_info(request_contract.STREAM)
    assert after.state.messages == small_request_stream.max_msgs


async def test_every_stream_is_bounded(admin_nc: Any) -> None:
    js = admin_nc.jetstream()
    for name in ("AGENT_REQUESTS", "INTENTROUTE_PIPELINE", "AGENT_RESPONSES", "AGENT_FEEDBACK",
                 "ANSWER_CLAIMS", "INTENTROUTE_DLQ"):
        cfg = (await js.stream_info(name)).config
        bounds = (cfg.max_bytes, cfg.max_msgs, cfg.max_age)
        assert all(b is not None and b > 0 for b in bounds), (name, bounds)
        if name != "AGENT_REQUESTS":  # one gateway consumer per active agent there
            assert cfg.max_consumers is not None
            assert cfg.max_consumers > 0, name


async def _store_answer(admin_nc: Any, agent: str, rid: str, texts: list[str]) -> list[bytes]:
    """Chunks stored on the answer's subject as a stage sends them (the last final)."""
    sent = []
    for seq, text in enumerate(texts):
        final = seq == len(texts) - 1
        data = encode(ResponseChunk(request_id=rid, seq=seq, text=text, is_final=final,
                                    kind=ChunkKind.FINAL if final else ChunkKind.TEXT))
        await admin_nc.jetstream().publish(response_subject(agent, rid), data,
                                           stream=response_contract.STREAM)
        sent.append(data)
    return sent


async def test_replay_is_served_by_the_gateway_for_the_askers_own_answers_only(
    admin_nc: Any, connect_as: Any, nats_url: str, database_url: str, tmp_path: Path,
) -> None:
    rid = uuid.uuid4().hex
    stored = await _store_answer(admin_nc, "agent-a", rid, ["Hello, ", "world."])
    owner, other = await connect_as("agent-a"), await connect_as("agent-b")
    js = admin_nc.jetstream()
    async with running(base_env(nats_url, database_url, tmp_path), ("gateway",)):
        got = [c async for c in replay(owner, "agent-a", rid, timeout=10)]
        assert [encode(c) for c in got] == stored
        # Another agent's request id reads the asker's own (empty) subject.
        theirs = [c async for c in replay(other, "agent-b", rid, timeout=10)]
        assert len(theirs) == 1
        assert theirs[0].is_final
        assert theirs[0].text == ""
        assert theirs[0].error is not None
        assert theirs[0].error.code == ErrorCode.UNKNOWN_REQUEST
        # Asking on the owner's replay subject is refused by the server: no answer.
        with pytest.raises(AnswerTimeoutError):
            [c async for c in replay(other, "agent-a", rid, timeout=2)]
        # An answer still in progress is followed to its final chunk.
        live = uuid.uuid4().hex
        first = encode(ResponseChunk(request_id=live, seq=0, text="part"))
        await js.publish(response_subject("agent-a", live), first)
        following = asyncio.ensure_future(_collect(replay(owner, "agent-a", live, timeout=10)))
        await asyncio.sleep(0.5)
        last = encode(ResponseChunk(request_id=live, seq=1, text=" done", is_final=True,
                                    kind=ChunkKind.FINAL))
        await js.publish(response_subject("agent-a", live), last)
        assert [encode(c) for c in await following] == [first, last]
        # The gateway removes its replay consumers once their replays are done.
        assert await _no_replay_consumers(js)


async def _collect(chunks: AsyncIterator[ResponseChunk]) -> list[ResponseChunk]:
    return [c async for c in chunks]


async def _no_replay_consumers(js: Any, wait: float = 5.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        infos = await js.consumers_info(response_contract.STREAM)
        if not [i for i in infos if i.name.startswith("replay-")]:
            return True
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.1)


def test_an_agents_sessions_are_capped_the_least_recently_used_expiring(
    database_url: str,
) -> None:
    """The cap is the database's (MAX_SESSIONS_PER_AGENT, written by `migrate`), on a
    database of its own: the shared one keeps its 10,000."""
    with fresh_database(database_url) as url:
        migrate(url, OwnerSettings(max_sessions_per_agent=3))
        asyncio.run(_capped_sessions(url))


async def _capped_sessions(database_url: str) -> None:
    agent = f"cap-{uuid.uuid4().hex[:8]}"
    store = await Store.connect(database_url)
    try:
        for n in range(5):
            await store.write(TurnRow(agent, f"s{n}", f"r{n}", "q", "a", "RETRIEVAL"))
            if n == 2:  # a new turn keeps s0 in use: it is not the oldest any more
                await store.write(TurnRow(agent, "s0", "r0b", "q", "a", "RETRIEVAL"))
    finally:
        await store.close()
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        sessions = {r["session_id"] for r in await conn.fetch(
            "SELECT session_id FROM sessions WHERE agent_id = $1", agent)}
        messages = {(r["session_id"], r["request_id"]) for r in await conn.fetch(
            "SELECT session_id, request_id FROM messages WHERE agent_id = $1", agent)}
    finally:
        await conn.close()
    assert sessions == {"s0", "s3", "s4"}
    # The expired sessions' messages went with them; s0 kept both its turns.
    assert messages == {("s0", "r0"), ("s0", "r0b"), ("s3", "r3"), ("s4", "r4")}
