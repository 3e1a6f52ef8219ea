"""The day-partitioned request log on a real Postgres: the migration moves existing rows
into their days' partitions, the group commit's upsert still turns a rewrite into an
update, a day without a partition never fails a write, and retention drops expired
partitions while the rollups stay."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from shared.accounting.retention import apply_retention
from shared.accounting.rollups import refresh_rollups
from shared.policy.agent import Price
from shared.store import asyncpg_dsn
from shared.store.partitions import (
    DEFAULT_PARTITION,
    ensure_partitions,
    partition_days,
    partition_name,
)
from shared.store.rows import RequestLogRow
from shared.store.stores import Store
from tests.helpers.databases import alembic_config, fresh_database

pytestmark = pytest.mark.integration

NOW = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0)
TODAY = NOW.date()


def at(days_ago: int, hour: int = 12) -> datetime:
    return datetime.combine(TODAY - timedelta(days=days_ago), datetime.min.time(),
                            tzinfo=UTC) + timedelta(hours=hour)


async def insert(conn: asyncpg.Connection, agent: str, request_id: str, created_at: datetime,
                 **extra: object) -> None:
    columns = {"agent_id": agent, "request_id": request_id, "session_id": "s",
               "outcome": "ok", "created_at": created_at, **extra}
    names = ", ".join(columns)
    marks = ", ".join(f"${i}" for i in range(1, len(columns) + 1))
    await conn.execute(f"INSERT INTO request_log ({names}) VALUES ({marks})", *columns.values())


async def partition_of(conn: asyncpg.Connection, agent: str, request_id: str) -> list[str]:
    rows = await conn.fetch("SELECT tableoid::regclass::text AS part FROM request_log "
                            "WHERE agent_id = $1 AND request_id = $2", agent, request_id)
    return [r["part"] for r in rows]


@pytest.fixture
def fresh_db(database_url: str) -> Iterator[str]:
    with fresh_database(database_url) as url:
        yield url


@pytest.fixture
async def conn(fresh_db: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(asyncpg_dsn(fresh_db))
    yield connection
    await connection.close()


def test_migration_moves_existing_rows_into_day_partitions(database_url: str) -> None:
    from alembic import command

    async def seed(url: str) -> None:
        c = await asyncpg.connect(asyncpg_dsn(url))
        try:
            for days_ago in (3, 1, 0):
                await insert(c, "mig-a", f"r{days_ago}", at(days_ago), tokens_in=days_ago)
            await insert(c, "mig-b", "r0", at(0, hour=1))  # same request id, other agent
        finally:
            await c.close()

    async def check_partitioned(url: str) -> None:
        c = await asyncpg.connect(asyncpg_dsn(url))
        try:
            for days_ago in (3, 1, 0):
                assert await partition_of(c, "mig-a", f"r{days_ago}") == [
                    partition_name(TODAY - timedelta(days=days_ago))]
            assert await c.fetchval(f"SELECT count(*) FROM {DEFAULT_PARTITION}") == 0
            days = set(await partition_days(c))
            assert {TODAY + timedelta(days=n) for n in range(8)} <= days
            assert await c.fetchval("SELECT relkind::text FROM pg_class WHERE relname = "
                                    "'request_log'") == "p"
            key = await c.fetchval(
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE conrelid = 'request_log'::regclass AND contype = 'p'")
            assert key == "PRIMARY KEY (agent_id, request_id, created_at)"
            assert await c.fetchval("SELECT count(*) FROM request_log") == 4
        finally:
            await c.close()

    async def check_downgraded(url: str) -> None:
        c = await asyncpg.connect(asyncpg_dsn(url))
        try:
            assert await c.fetchval("SELECT relkind::text FROM pg_class WHERE relname = "
                                    "'request_log'") == "r"
            rows = await c.fetch("SELECT agent_id, request_id, tokens_in FROM request_log "
                                 "ORDER BY agent_id, request_id")
            assert [tuple(r) for r in rows] == [
                ("mig-a", "r0", 0), ("mig-a", "r1", 1), ("mig-a", "r3", 3), ("mig-b", "r0", 0)]
        finally:
            await c.close()

    with fresh_database(database_url, revision="0004") as url:
        asyncio.run(seed(url))
        command.upgrade(alembic_config(url), "0005")
        asyncio.run(check_partitioned(url))
        command.downgrade(alembic_config(url), "0004")
        asyncio.run(check_downgraded(url))
        command.upgrade(alembic_config(url), "head")
        asyncio.run(check_partitioned(url))


async def test_a_run_rewrites_its_own_row_and_a_later_message_writes_its_own(fresh_db: str) -> None:
    store = await Store.connect(fresh_db)
    try:
        agent, request_id = "rewrite", uuid.uuid4().hex
        admitted = at(2, hour=23).timestamp() + 0.123456
        async with store.pool.acquire() as c:
            await ensure_partitions(c, [TODAY - timedelta(days=2)])
        first = RequestLogRow(request_id=request_id, agent_id=agent, session_id="s",
                              outcome="ok", model="m", tokens_in=10, created_at=admitted)
        await store.write(first)
        # An error row after the answer attempt (a redelivery), same admission time.
        await store.write(RequestLogRow(request_id=request_id, agent_id=agent,
                                        session_id="s", outcome="error:STAGE_FAILED",
                                        created_at=admitted))
        # A row without an envelope (a later message naming the id: no admission time)
        # is a row of its own, now: it never rewrites what was logged for the run.
        await store.write(RequestLogRow(request_id=request_id, agent_id=agent,
                                        session_id="s", outcome="error:LATE"))
        rows = await store.pool.fetch(
            "SELECT outcome, model, tokens_in, created_at, tableoid::regclass::text AS part "
            "FROM request_log WHERE agent_id = $1 AND request_id = $2 ORDER BY created_at",
            agent, request_id)
        assert [r["outcome"] for r in rows] == ["error:STAGE_FAILED", "error:LATE"]
        assert rows[0]["created_at"].timestamp() == pytest.approx(admitted, abs=1e-6)
        assert rows[0]["part"] == partition_name(TODAY - timedelta(days=2))
        assert rows[1]["created_at"].timestamp() > admitted + 86_400
    finally:
        await store.close()


async def test_a_day_without_a_partition_lands_in_default_then_moves(fresh_db: str) -> None:
    store = await Store.connect(fresh_db)
    try:
        far = at(-40)  # 40 days ahead: no partition exists for it
        request_id = uuid.uuid4().hex
        await store.write(RequestLogRow(request_id=request_id, agent_id="future",
                                        session_id="s", outcome="ok",
                                        created_at=far.timestamp()))
        conn = await store.pool.acquire()
        try:
            assert await partition_of(conn, "future", request_id) == [DEFAULT_PARTITION]
            made = await ensure_partitions(conn, [])
            assert made == {"created": 1, "moved_from_default": 1}
            assert await partition_of(conn, "future", request_id) == [
                partition_name(far.date())]
            # A rewrite after the move still meets the same row.
            await store.write(RequestLogRow(request_id=request_id, agent_id="future",
                                            session_id="s", outcome="error:X",
                                            created_at=far.timestamp()))
            assert await conn.fetchval(
                "SELECT outcome FROM request_log WHERE agent_id = 'future' "
                "AND request_id = $1", request_id) == "error:X"
            assert await ensure_partitions(conn, []) == {"created": 0, "moved_from_default": 0}
        finally:
            await store.pool.release(conn)
    finally:
        await store.close()


async def test_retention_drops_expired_partitions_and_keeps_rollups(
    conn: asyncpg.Connection,
) -> None:
    agent = "retention"
    for days_ago in (45, 31, 30, 29, 1, 0):
        for n in range(3):
            await insert(conn, agent, f"d{days_ago}-{n}", at(days_ago), model="m",
                         tokens_in=100, tokens_out=10, total_ms=float(10 * (n + 1)))
    await ensure_partitions(conn, [])  # old days' rows waited in the DEFAULT partition
    # Rollup rows of long ago: one past the year, one within it.
    for days_ago in (400, 200):
        await conn.execute(
            "INSERT INTO daily_rollups (day, agent_id, model, query_type, layer, requests) "
            "VALUES ($1, $2, 'm', '', '', 7)", TODAY - timedelta(days=days_ago), agent)
    prices = {agent: {"m": Price(input_per_1k=1.0, output_per_1k=2.0)}}

    result = await apply_retention(conn, NOW, hot_days=30, rollup_days=365, prices=prices)

    days = await partition_days(conn)
    for gone in (45, 31):
        assert TODAY - timedelta(days=gone) not in days
    for kept in (30, 29, 1, 0):
        assert TODAY - timedelta(days=kept) in days
    assert result["partitions_dropped"] == 2
    assert result["rollup_rows_deleted"] == 1
    remaining = await conn.fetch(
        "SELECT (created_at AT TIME ZONE 'UTC')::date AS day, count(*) AS n FROM request_log "
        "WHERE agent_id = $1 GROUP BY 1 ORDER BY 1", agent)
    assert [(r["day"], r["n"]) for r in remaining] == [
        (TODAY - timedelta(days=d), 3) for d in (30, 29, 1, 0)]
    rollups = {r["day"]: (r["requests"], r["tokens_in"], r["cost"]) for r in await conn.fetch(
        "SELECT day, requests, tokens_in, cost FROM daily_rollups WHERE agent_id = $1", agent)}
    # The dropped days were rolled up before they went, and stay.
    for gone in (45, 31):
        assert rollups[TODAY - timedelta(days=gone)] == (3, 300, pytest.approx(0.36))
    assert TODAY - timedelta(days=200) in rollups
    assert TODAY - timedelta(days=400) not in rollups
    # Refreshing the dropped days later leaves their rollups alone.
    refreshed = await refresh_rollups(conn, TODAY - timedelta(days=50), TODAY, prices)
    assert refreshed["skipped_days"] == 20
    after = {r["day"] for r in await conn.fetch(
        "SELECT day FROM daily_rollups WHERE agent_id = $1", agent)}
    assert {TODAY - timedelta(days=45), TODAY - timedelta(days=31)} <= after
    # Ahead partitions exist, and a second pass changes nothing.
    assert {TODAY + timedelta(days=n) for n in range(8)} <= set(days)
    again = await apply_retention(conn, NOW, hot_days=30, rollup_days=365, prices=prices)
    assert (again["partitions_dropped"], again["partitions_created"],
            again["rollup_rows_deleted"]) == (0, 0, 0)


async def test_refresh_rollups_is_idempotent_and_matches_the_log(
    conn: asyncpg.Connection,
) -> None:
    agent = "rollups"
    totals = [float(n) for n in range(1, 101)]
    for n, total in enumerate(totals):
        await insert(conn, agent, f"r{n}", at(1, hour=n % 24), model="big", query_type="RETRIEVAL",
                     layer="rules", tokens_in=n, tokens_out=2 * n, compute_ms=100.0,
                     total_ms=total, fallback=n % 10 == 0,
                     outcome="error:X" if n % 25 == 0 else "ok")
    prices = {agent: {"big": Price(input_per_1k=1.0, output_per_1k=3.0, per_compute_s=0.5)}}
    day = TODAY - timedelta(days=1)
    first = await refresh_rollups(conn, day, day, prices)
    second = await refresh_rollups(conn, day, day, prices)
    assert first == second
    row = await conn.fetchrow("SELECT * FROM daily_rollups WHERE agent_id = $1", agent)
    assert (row["day"], row["model"], row["query_type"], row["layer"]) == (
        day, "big", "RETRIEVAL", "rules")
    assert (row["requests"], row["errors"], row["fallbacks"]) == (100, 4, 10)
    assert (row["tokens_in"], row["tokens_out"]) == (4950, 9900)
    assert row["compute_s"] == pytest.approx(10.0)
    assert row["cost"] == pytest.approx(4950 / 1000 + 9900 / 1000 * 3 + 10.0 * 0.5)
    # percentile_cont over 1..100: p50 50.5, p95 95.05, p99 99.01.
    assert (row["latency_p50_ms"], row["latency_p95_ms"], row["latency_p99_ms"]) == (
        pytest.approx(50.5), pytest.approx(95.05), pytest.approx(99.01))
    latency = await conn.fetchrow("SELECT * FROM daily_agent_latency WHERE agent_id = $1",
                                  agent)
    assert (latency["requests"], latency["latency_p95_ms"]) == (100, pytest.approx(95.05))



async def test_a_busy_log_defers_the_drop_instead_of_stalling_writes(
    conn: asyncpg.Connection, fresh_db: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shared.store import partitions

    monkeypatch.setattr(partitions, "DROP_LOCK_TIMEOUT", "200ms")
    await insert(conn, "busy", "old", at(40))
    await ensure_partitions(conn, [])
    reader = await asyncpg.connect(asyncpg_dsn(fresh_db))
    try:
        # A long reader of the log (a report) holds it while retention runs.
        async with reader.transaction():
            await reader.fetchval("SELECT count(*) FROM request_log")
            result = await apply_retention(conn, NOW, hot_days=30, prices={})
            assert (result["drop_deferred"], result["partitions_dropped"]) == (True, 0)
            assert TODAY - timedelta(days=40) in await partition_days(conn)
    finally:
        await reader.close()
    result = await apply_retention(conn, NOW, hot_days=30, prices={})
    assert (result["drop_deferred"], result["partitions_dropped"]) == (False, 1)
    assert TODAY - timedelta(days=40) not in await partition_days(conn)


async def test_the_jobs_accounting_phase_refreshes_stale_days_then_retention(
    conn: asyncpg.Connection,
) -> None:
    from shared.accounting.phase import accounting_phase

    agent = "job"
    for days_ago in (3, 1, 0):
        await insert(conn, agent, f"d{days_ago}", at(days_ago), model="m", tokens_in=1000)
    await ensure_partitions(conn, [])
    await conn.execute("INSERT INTO agent_policies (agent_id, settings) VALUES "
                       "($1, '{\"prices\": {\"m\": {\"input_per_1k\": 2.0}}}')", agent)
    phase = accounting_phase(hot_days=30, rollup_days=365)

    async def rollups() -> dict[object, tuple[int, float]]:
        return {r["day"]: (r["requests"], r["cost"]) for r in await conn.fetch(
            "SELECT day, requests, cost FROM daily_rollups WHERE agent_id = $1", agent)}

    first = await phase(conn, lambda: NOW)
    # Nothing rolled up yet: the whole hot window, with the agent's stored price.
    assert first["refreshed_from"] == (TODAY - timedelta(days=30)).isoformat()
    assert await rollups() == {TODAY - timedelta(days=d): (1, 2.0) for d in (3, 1, 0)}
    # A late row of yesterday and one of three days ago: only yesterday is refreshed.
    await insert(conn, agent, "late1", at(1, hour=23), model="m", tokens_in=1000)
    await insert(conn, agent, "late3", at(3, hour=23), model="m", tokens_in=1000)
    second = await phase(conn, lambda: NOW)
    assert second["refreshed_from"] == (TODAY - timedelta(days=1)).isoformat()
    assert (await rollups())[TODAY - timedelta(days=1)] == (2, 4.0)
    assert (await rollups())[TODAY - timedelta(days=3)] == (1, 2.0)


async def test_the_schema_of_record_matches_the_migrated_database(fresh_db: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlalchemy.ext.asyncio import create_async_engine

    from shared.store import sqlalchemy_url
    from shared.store.models import metadata
    from shared.store.partitions import is_partition

    def include(obj, name, type_, reflected, compare_to):  # type: ignore[no-untyped-def]
        table = obj.table.name if type_ in ("index", "unique_constraint") else name
        return not (reflected and is_partition(table))

    engine = create_async_engine(sqlalchemy_url(fresh_db))
    try:
        async with engine.connect() as sync_conn:
            diff = await sync_conn.run_sync(lambda c: compare_metadata(
                MigrationContext.configure(c, opts={"include_object": include}), metadata))
    finally:
        await engine.dispose()
    assert diff == []
