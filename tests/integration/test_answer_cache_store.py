"""The answer cache's table on a real Postgres with the deployment's roles (migration
0019): who may store, read and count entries, and through what; the cap, the TTL, the
invalidation an ingest runs, verdicts that evict, and the NOTIFY every change sends."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any, NamedTuple

import asyncpg
import pytest

from intentroute.stack import PostgresServer
from intentroute.stack.pgroles import DatabaseUrls, database_urls, init_database, role_passwords
from shared.cache.entries import (
    SQL_HIT,
    SQL_PUT,
    clear,
    entries_by_id,
    invalidate_sources,
    live_entries,
    stats,
)
from shared.cache.listen import CHANNEL
from shared.contracts.feedback import Feedback, FeedbackMetadata, FeedbackOutcome
from shared.store import asyncpg_dsn, migrate
from shared.store.feedback_table import FeedbackTable
from shared.store.owner_settings import OwnerSettings
from shared.store.rows import RequestLogRow
from shared.store.stores import Store

pytestmark = pytest.mark.integration

CAP = 3


class Deployment(NamedTuple):
    pg: PostgresServer
    urls: DatabaseUrls

    def url(self, who: str) -> str:
        return self.urls.worker(who)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    pg = PostgresServer(tmp_path_factory.mktemp("pg-cache")).start()
    try:
        passwords = role_passwords(pg.data_dir)
        asyncio.run(init_database(pg.url, pg.DB, passwords))
        urls = database_urls(pg.url, passwords)
        migrate(urls.owner, OwnerSettings(answer_cache_per_agent=CAP))
        yield Deployment(pg, urls)
    finally:
        pg.stop()


@pytest.fixture
async def owner(deployment: Deployment) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(asyncpg_dsn(deployment.urls.owner))
    yield conn
    await conn.close()


async def _as(deployment: Deployment, who: str) -> asyncpg.Connection:
    return await asyncpg.connect(asyncpg_dsn(deployment.url(who)))


async def _agent(owner: asyncpg.Connection, **policy: Any) -> str:
    agent = f"ac-{uuid.uuid4().hex[:8]}"
    await owner.execute("INSERT INTO agents (agent_id, secret_hash) VALUES ($1, 'h')", agent)
    await owner.execute("INSERT INTO agent_policies (agent_id, settings) VALUES ($1, $2::jsonb)",
                        agent, json.dumps(policy))
    return agent


def _put_args(agent: str, request: str = "", *, query: str = "What does addVar do?",
              qtype: str = "RETRIEVAL", status: str = "", sources: tuple[str, ...] = ("a.md",),
              accepted: float | None = None) -> tuple[Any, ...]:
    return (agent, request or uuid.uuid4().hex, query, qtype, "en", "main", "extractive",
            "addVar declares a variable.", "", status, list(sources),
            ["v1"] * len(sources), 120, True, time.time() if accepted is None else accepted)


async def test_the_generator_and_validator_store_only_through_the_function(
        deployment: Deployment, owner: asyncpg.Connection) -> None:
    agent = await _agent(owner, cache=True)
    for worker in ("generator-main", "validator"):
        conn = await _as(deployment, worker)
        try:
            assert await conn.fetchval(SQL_PUT, *_put_args(agent)) is not None
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.fetch("SELECT * FROM answer_cache")
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(
                    "INSERT INTO answer_cache (agent_id, request_id, query, query_type, lang, "
                    "model_slot, model, answer, sources, versions, accepted_at, expires_at) "
                    "VALUES ($1, 'x', 'q', 'RETRIEVAL', 'en', 'main', 'm', 'planted', '{a}', "
                    "'{v}', now(), now() + interval '1 day')", agent)
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.fetchval(SQL_HIT, agent, "r", 1)
        finally:
            await conn.close()


async def test_the_classifier_reads_and_counts_but_never_writes(
        deployment: Deployment, owner: asyncpg.Connection) -> None:
    agent = await _agent(owner, cache=True)
    entry = await owner.fetchval(SQL_PUT, *_put_args(agent))
    conn = await _as(deployment, "classifier")
    try:
        assert entry in {e.id for e in await live_entries(conn)}
        assert await conn.fetchval(SQL_HIT, agent, "served-1", entry) is True
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.fetchval(SQL_PUT, *_put_args(agent))
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("DELETE FROM answer_cache WHERE agent_id = $1", agent)
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("UPDATE answer_cache SET answer = 'planted' WHERE id = $1", entry)
    finally:
        await conn.close()
    assert await owner.fetchval("SELECT hits FROM answer_cache WHERE id = $1", entry) == 1
    for role in ("gateway", "retriever"):
        other = await _as(deployment, role)
        try:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await other.fetch("SELECT * FROM answer_cache")
        finally:
            await other.close()


async def test_nothing_is_stored_for_an_agent_without_the_cache_or_an_unclean_answer(
        owner: asyncpg.Connection) -> None:
    off = await _agent(owner)
    on = await _agent(owner, cache=True)
    assert await owner.fetchval(SQL_PUT, *_put_args(off)) is None
    refused = [
        _put_args(on, qtype="PLATFORM"), _put_args(on, qtype="CONVERSATIONAL"),
        _put_args(on, qtype="CODE_GENERATION", status="INVALID_UNRESOLVED"),
        _put_args(on, qtype="CODE_GENERATION", status="PARSER_UNAVAILABLE"),
        _put_args(on, sources=()),
    ]
    for args in refused:
        assert await owner.fetchval(SQL_PUT, *args) is None, args
    assert await owner.fetchval(SQL_PUT, *_put_args(on, qtype="CODE_GENERATION")) is not None


async def test_a_count_for_another_agents_entry_is_refused_unless_both_share_a_group(
        deployment: Deployment, owner: asyncpg.Connection) -> None:
    a = await _agent(owner, cache=True, cache_group="docs")
    b = await _agent(owner, cache=True)
    c = await _agent(owner, cache=True, cache_group="docs")
    entry = await owner.fetchval(SQL_PUT, *_put_args(a))
    conn = await _as(deployment, "classifier")
    try:
        assert await conn.fetchval(SQL_HIT, b, "r-b", entry) is False
        assert await conn.fetchval(SQL_HIT, c, "r-c", entry) is True
    finally:
        await conn.close()


async def test_the_cap_evicts_the_least_recently_used(
        deployment: Deployment, owner: asyncpg.Connection) -> None:
    agent = await _agent(owner, cache=True)
    ids = [await owner.fetchval(SQL_PUT, *_put_args(agent)) for _ in range(CAP)]
    await owner.fetchval(SQL_HIT, agent, "r-used", ids[0])  # the oldest, used since
    newest = await owner.fetchval(SQL_PUT, *_put_args(agent))
    kept = {r["id"] for r in await owner.fetch(
        "SELECT id FROM answer_cache WHERE agent_id = $1", agent)}
    assert kept == {ids[0], ids[2], newest}
    totals = (await stats(deployment.urls.owner, agent))["agents"][agent]
    assert totals["evicted_cap"] == 1
    assert totals["entries"] == CAP


async def test_the_agents_ttl_expires_entries(owner: asyncpg.Connection) -> None:
    agent = await _agent(owner, cache=True, cache_ttl=1)
    first = await owner.fetchval(SQL_PUT, *_put_args(agent))
    assert first in {e.id for e in await live_entries(owner)}
    await asyncio.sleep(1.2)
    assert first not in {e.id for e in await live_entries(owner)}
    await owner.fetchval(SQL_PUT, *_put_args(agent))  # the next store deletes it
    assert await owner.fetchval("SELECT count(*) FROM answer_cache WHERE id = $1", first) == 0


async def test_a_changed_source_invalidates_the_answers_built_on_it_and_nothing_else(
        owner: asyncpg.Connection) -> None:
    agent = await _agent(owner, cache=True)
    http = await owner.fetchval(SQL_PUT, *_put_args(agent, sources=("http.md",)))
    both = await owner.fetchval(SQL_PUT, *_put_args(agent, sources=("http.md", "loops.md")))
    loops = await owner.fetchval(SQL_PUT, *_put_args(agent, sources=("loops.md",)))
    gone = await invalidate_sources(owner, {"http.md": time.time()})
    assert gone >= 2
    left = {e.id for e in await entries_by_id(owner, [http, both, loops])}
    assert left == {loops}
    # An answer admitted before the change (retrieved from the old version) is refused.
    assert await owner.fetchval(SQL_PUT, *_put_args(
        agent, sources=("http.md",), accepted=time.time() - 1)) is None
    # A source gone from the index takes its answers with it.
    await invalidate_sources(owner, {}, indexed=["http.md"])
    assert await entries_by_id(owner, [loops]) == []


async def test_a_negative_verdict_on_the_original_or_a_served_request_evicts_the_entry(
        deployment: Deployment, owner: asyncpg.Connection) -> None:
    agent = await _agent(owner, cache=True)
    original, served = uuid.uuid4().hex, uuid.uuid4().hex
    first = await owner.fetchval(SQL_PUT, *_put_args(agent, original))
    second = await owner.fetchval(SQL_PUT, *_put_args(agent))
    await owner.fetchval(SQL_HIT, agent, served, second)
    store = await Store.connect(deployment.url("gateway"))
    try:
        for request in (original, served):
            await store.write(RequestLogRow(request_id=request, agent_id=agent, session_id="s",
                                            outcome="ok", created_at=time.time()))
        table = FeedbackTable(store.pool)
        ok = Feedback(request_id=original, outcome=FeedbackOutcome.SUCCESS)
        assert (await table.record_explicit(agent, ok)).stored
        assert await owner.fetchval("SELECT feedback_pos FROM answer_cache WHERE id = $1",
                                    first) == 1
        low = Feedback(request_id=original, outcome=FeedbackOutcome.SUCCESS,
                       metadata=FeedbackMetadata(completion_quality=2))
        await table.record_explicit(agent, low)
        await table.record_explicit(agent, Feedback(request_id=served,
                                                    outcome=FeedbackOutcome.USER_REJECTED))
    finally:
        await store.close()
    assert await entries_by_id(owner, [first, second]) == []
    # A verdict already given keeps the answer out of the cache.
    assert await owner.fetchval(SQL_PUT, *_put_args(agent, original)) is None


async def test_every_stored_and_deleted_entry_is_announced(
        deployment: Deployment, owner: asyncpg.Connection) -> None:
    agent = await _agent(owner, cache=True)
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await _as(deployment, "classifier")  # LISTEN needs no privilege
    await listener.add_listener(CHANNEL, lambda *args: heard.put_nowait(args[-1]))
    try:
        entry = await owner.fetchval(SQL_PUT, *_put_args(agent))
        assert await asyncio.wait_for(heard.get(), 5) == f"+{entry}"
        assert await clear(deployment.urls.owner, agent) == 1
        assert await asyncio.wait_for(heard.get(), 5) == f"-{entry}"
    finally:
        await listener.close()


class FakeVectors:
    """The classifier's vectors for a replica's index: one fixed vector per question."""

    encoder = object()
    layers = 0

    async def vector(self, text: str) -> Any:
        import numpy as np

        return np.ones(4, dtype=np.float32)

    async def encode(self, texts: list[str]) -> Any:
        import numpy as np

        return np.ones((len(texts), 4), dtype=np.float32)


async def test_a_replica_follows_the_table_and_resyncs_after_losing_its_listener(
        deployment: Deployment, owner: asyncpg.Connection) -> None:
    from services.classifier.answer_cache import ClassifierCache
    from shared.common.settings import CommonSettings
    from shared.store.policy_cache import PolicyCache

    agent = await _agent(owner, cache=True)
    kept = await owner.fetchval(SQL_PUT, *_put_args(agent))
    url = deployment.url("classifier")
    pool = await asyncpg.create_pool(asyncpg_dsn(url), min_size=1, max_size=2)
    cache = ClassifierCache(pool, asyncpg_dsn(url), CommonSettings(), PolicyCache(dict),
                            FakeVectors())  # type: ignore[arg-type]
    try:
        await cache.start()
        await cache.settled(lambda index: kept in index)
        await asyncio.wait_for(cache.listening.wait(), 10)
        added = await owner.fetchval(SQL_PUT, *_put_args(agent))
        await cache.settled(lambda index: added in index)
        # The listening connection dies; what changes meanwhile is not announced to it.
        assert cache.reloads == 1
        superuser = await asyncpg.connect(asyncpg_dsn(deployment.pg.url))
        try:
            assert await superuser.fetchval(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE usename = 'intentroute_classifier' AND query LIKE 'LISTEN%') AS t") == 1
        finally:
            await superuser.close()
        await owner.execute("DELETE FROM answer_cache WHERE id = $1", kept)
        later = await owner.fetchval(SQL_PUT, *_put_args(agent))
        await cache.settled(lambda index: kept not in index and later in index, timeout=20)
        assert cache.reloads == 2  # reloaded from the table, not told
    finally:
        await cache.close()
        await pool.close()
