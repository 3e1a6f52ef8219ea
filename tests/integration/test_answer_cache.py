"""The per-agent answer cache end to end (issue 33), every worker on real NATS JetStream
and PostgreSQL with the extractive answerer: a paraphrase is answered from the cache
like any answer, near-duplicates and other agents' entries never are, what may not be
stored never is, and a changed document takes the answers built on it away."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from shared.client.caller import assemble
from shared.contracts.response import ChunkKind, ResponseChunk
from shared.store import asyncpg_dsn
from tests.helpers.agents import Connections, add_agents
from tests.helpers.cache import cache_writers, classifier_cache
from tests.helpers.pipeline import ask_all, base_env, make_request, running

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# Agents of their own: a policy set here never changes another test's answers.
AGENTS = {"cache-a": False, "cache-b": False, "cache-c": False, "cache-t": True}


@pytest.fixture(scope="module")
async def cache_agents(stack: tuple[str, str]) -> dict[str, Any]:
    return await add_agents(*stack, AGENTS)


@pytest.fixture
async def connect(nats_url: str, cache_agents: dict[str, Any]) -> AsyncIterator[Any]:
    connections = Connections(nats_url, cache_agents)
    yield connections
    await connections.close()


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    yield conn
    await conn.close()


async def set_policy(db: asyncpg.Connection, agent: str, **policy: Any) -> None:
    import json

    await db.execute(
        "INSERT INTO agent_policies (agent_id, settings) VALUES ($1, $2::jsonb) "
        "ON CONFLICT (agent_id) DO UPDATE SET settings = EXCLUDED.settings",
        agent, json.dumps(policy))
    await db.execute("DELETE FROM answer_cache WHERE agent_id = $1", agent)


async def stored(apps: list[Any], request_id: str) -> int:
    """The entry stored for a request, once the classifier's index holds it (the stage
    offers the answer after its final chunk went out)."""
    found: list[int] = []

    def holds(index: Any) -> bool:
        found[:] = [e.id for e in index.entries() if e.request_id == request_id]
        return bool(found)

    await classifier_cache(apps).settled(holds)
    return found[0]


async def none_stored(apps: list[Any], nc: Any, db: asyncpg.Connection, agent: str,
                      request_ids: list[str]) -> None:
    """None of these requests' answers is stored: a request asked after them, whose
    answer is, is stored after whatever they offered was tried."""
    sentinel = make_request(f"What does getListLen return? {time.time_ns()}", agent_id=agent)
    await ask_all(nc, sentinel)
    await stored(apps, sentinel.request_id)
    for writer in cache_writers(apps):
        await writer.flush()
    assert await db.fetch("SELECT request_id FROM answer_cache WHERE request_id = ANY($1)",
                          request_ids) == []


def final(chunks: list[ResponseChunk]) -> ResponseChunk:
    assert sum(c.is_final for c in chunks) == 1
    assert chunks[-1].is_final
    assert [c.seq for c in chunks] == sorted(c.seq for c in chunks)
    return chunks[-1]


async def test_a_paraphrase_is_answered_from_the_cache_like_an_answer(
        connect, db, nats_url, database_url, kb_index) -> None:
    await set_policy(db, "cache-a", cache=True)
    nc = await connect("cache-a")
    env = base_env(nats_url, database_url, kb_index)
    async with running(env) as apps:
        first = make_request("What does addVar do?", agent_id="cache-a", session_id="s-cache")
        original = await ask_all(nc, first)
        assert final(original).answered_by == "extractive"
        entry = await stored(apps, first.request_id)

        again = make_request("How does addVar work?", agent_id="cache-a", session_id="s-cache")
        started = time.time()
        chunks = await ask_all(nc, again)
        hit = final(chunks)
        assert hit.answered_by == "cache"
        assert hit.error is None
        assert hit.kind == ChunkKind.FINAL
        assert hit.query_type == "RETRIEVAL"
        assert hit.cached_from is not None
        assert hit.cached_from.request_id == first.request_id
        assert 0 <= hit.cached_from.age_s <= time.time() - started + 60
        assert assemble(chunks) == assemble(original)
        # A near-duplicate is not: another command, a negation.
        for near in ("What does addParam do?", "What does addVar not do?"):
            miss = final(await ask_all(nc, make_request(near, agent_id="cache-a")))
            assert miss.answered_by == "extractive", near

        # The next CONVERSATIONAL turn refers to the cached answer.
        follow = await ask_all(nc, make_request("say it again", agent_id="cache-a",
                                                session_id="s-cache",
                                                query_type="CONVERSATIONAL"))
        assert assemble(original).split("]\n", 1)[-1][:40] in assemble(follow)

    log = await db.fetchrow(
        "SELECT answered_by, model, tokens_in, tokens_out, tokens_note, outcome, stage_ms "
        "FROM request_log WHERE agent_id = 'cache-a' AND request_id = $1", again.request_id)
    assert log["answered_by"] == "cache"
    assert log["model"] == "cache"
    assert (log["tokens_in"], log["tokens_out"]) == (0, 0)
    assert log["tokens_note"].startswith("cache: ")
    assert log["outcome"] == "ok"
    turn = await db.fetchval(
        "SELECT content FROM messages WHERE agent_id = 'cache-a' AND request_id = $1 "
        "AND role = 'assistant'", again.request_id)
    assert turn == assemble(original)
    counted = await db.fetchrow("SELECT hits, last_hit_at FROM answer_cache WHERE id = $1",
                                entry)
    assert counted["hits"] >= 1
