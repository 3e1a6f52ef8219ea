"""What the deployment's Postgres roles may do, on a real Postgres deployed as `up`
deploys it (the superuser's init, then every migration as the owner):

- no worker widens what the owner's SECURITY DEFINER functions touch. The sessions cap
  trigger (migration 0011) runs as the owner and deletes sessions and messages no worker
  role may delete; it read its cap from a setting every caller can set (`SET LOCAL
  intentroute.max_sessions_per_agent = '1'`), so any stage could expire another agent's
  sessions with one INSERT. Since migration 0014 it reads `owner_settings`, which only
  the owner writes (`intentroute migrate` / `up`); the learner drops no request-log
  partition inside the owner's hot window either;
- every privilege any role holds is the one docs/reference/permissions-postgres.md
  lists (`intentroute docs permissions-postgres` writes it again)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import NamedTuple

import asyncpg
import pytest
from typer.testing import CliRunner

from intentroute.cli import app
from intentroute.docs import pg_permissions
from intentroute.stack import PostgresServer
from intentroute.stack.pgroles import DatabaseUrls
from shared.store import asyncpg_dsn, migrate
from shared.store.owner_settings import OwnerSettings, read_owner_settings
from tests.helpers.databases import alembic_config, fresh_database

pytestmark = pytest.mark.integration

COMMITTED = Path(__file__).resolve().parents[2] / pg_permissions.DEFAULT_OUT
REGENERATE = (f"{pg_permissions.DEFAULT_OUT} is not what the server grants: run "
              "`intentroute docs permissions-postgres` (and review what changed)")
# One worker of each role that writes sessions (both generator slots share a role).
WRITERS = ("gateway", "classifier", "retriever", "generator-main", "validator")


class Deployment(NamedTuple):
    pg: PostgresServer
    urls: DatabaseUrls

    def url(self, who: str) -> str:
        return self.urls.learner if who == "learner" else self.urls.worker(who)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    pg = PostgresServer(tmp_path_factory.mktemp("pg-privileges")).start()
    try:
        yield Deployment(pg, pg_permissions.deploy(pg))
    finally:
        pg.stop()


@pytest.fixture
async def owner(deployment: Deployment) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(asyncpg_dsn(deployment.urls.owner))
    yield conn
    await conn.close()


async def _victim(owner: asyncpg.Connection, sessions: int = 3) -> str:
    """An agent with `sessions` sessions of one turn each."""
    agent = f"victim-{uuid.uuid4().hex[:8]}"
    for n in range(sessions):
        await owner.execute("INSERT INTO sessions (agent_id, session_id) VALUES ($1, $2)",
                            agent, f"s{n}")
        for role in ("user", "assistant"):
            await owner.execute(
                "INSERT INTO messages (agent_id, session_id, request_id, role, content) "
                "VALUES ($1, $2, $3, $4, 'text')", agent, f"s{n}", f"r{n}", role)
    return agent


async def _kept(owner: asyncpg.Connection, agent: str) -> tuple[set[str], int]:
    sessions = {r["session_id"] for r in await owner.fetch(
        "SELECT session_id FROM sessions WHERE agent_id = $1", agent)}
    messages = await owner.fetchval("SELECT count(*) FROM messages WHERE agent_id = $1", agent)
    return sessions, messages


@pytest.mark.parametrize("worker", WRITERS)
async def test_no_worker_shrinks_the_session_cap_to_expire_another_agents_sessions(
        deployment: Deployment, owner: asyncpg.Connection, worker: str) -> None:
    """The attack: the cap set to 1 for one transaction, then one new session in the
    victim's name; the trigger, running as the owner, would expire all the others."""
    victim = await _victim(owner)
    attacker = await asyncpg.connect(asyncpg_dsn(deployment.urls.worker(worker)))
    try:
        async with attacker.transaction():
            await attacker.execute("SET LOCAL intentroute.max_sessions_per_agent = '1'")
            await attacker.execute(
                "INSERT INTO sessions (agent_id, session_id) VALUES ($1, 'intruder')", victim)
    finally:
        await attacker.close()
    assert await _kept(owner, victim) == ({"s0", "s1", "s2", "intruder"}, 6)


@pytest.mark.parametrize("worker", WRITERS)
async def test_no_worker_shrinks_the_cap_for_its_whole_connection(
        deployment: Deployment, owner: asyncpg.Connection, worker: str) -> None:
    """The same through the connection's startup settings (what Store.connect sent)."""
    victim = await _victim(owner)
    attacker = await asyncpg.connect(
        asyncpg_dsn(deployment.urls.worker(worker)),
        server_settings={"intentroute.max_sessions_per_agent": "1"})
    try:
        await attacker.execute(
            "INSERT INTO sessions (agent_id, session_id) VALUES ($1, 'intruder')", victim)
    finally:
        await attacker.close()
    assert await _kept(owner, victim) == ({"s0", "s1", "s2", "intruder"}, 6)


async def test_the_cap_is_the_one_migrate_wrote(
        deployment: Deployment, owner: asyncpg.Connection) -> None:
    """MAX_SESSIONS_PER_AGENT reaches the trigger through `migrate` (as `intentroute
    migrate` and `up` pass it); a worker's setting changes nothing."""
    agent = f"capped-{uuid.uuid4().hex[:8]}"
    await asyncio.to_thread(migrate, deployment.urls.owner, OwnerSettings(2, 30))
    try:
        worker = await asyncpg.connect(
            asyncpg_dsn(deployment.url("retriever")),
            server_settings={"intentroute.max_sessions_per_agent": "100"})
        try:
            for n in range(3):
                await worker.execute(
                    "INSERT INTO sessions (agent_id, session_id, updated_at) "
                    "VALUES ($1, $2, now() + $3 * interval '1 second')", agent, f"s{n}", n)
        finally:
            await worker.close()
        assert (await _kept(owner, agent))[0] == {"s1", "s2"}
    finally:
        await asyncio.to_thread(migrate, deployment.urls.owner, OwnerSettings())
    assert await read_owner_settings(owner) == OwnerSettings()


@pytest.mark.parametrize("who", [*WRITERS, "learner"])
@pytest.mark.parametrize("statement", [
    "SELECT * FROM owner_settings",
    "UPDATE owner_settings SET max_sessions_per_agent = 1",
    "INSERT INTO owner_settings (id) VALUES (true) ON CONFLICT DO NOTHING",
    "DELETE FROM owner_settings",
])
async def test_only_the_owner_touches_its_settings(
        deployment: Deployment, who: str, statement: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(deployment.url(who)))
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute(statement)
    finally:
        await conn.close()


async def _partitions(conn: asyncpg.Connection) -> set[str]:
    return {r["relname"] for r in await conn.fetch(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'request_log'::regclass")}


async def test_the_learner_drops_no_partition_inside_the_owners_hot_window(
        deployment: Deployment, owner: asyncpg.Connection) -> None:
    """`request_log_drop_partition` runs as the owner: the day a caller names no longer
    decides alone what goes; the server's clock and the owner's 30 days do."""
    today: date = await owner.fetchval("SELECT (now() AT TIME ZONE 'UTC')::date")
    recent, old = today - timedelta(days=3), today - timedelta(days=31)
    learner = await asyncpg.connect(asyncpg_dsn(deployment.url("learner")))
    try:
        for day in (recent, old):
            await learner.execute("SELECT request_log_create_partition($1)", day)
        for day in (today, recent, today - timedelta(days=30)):
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="owner keeps"):
                await learner.execute("SELECT request_log_drop_partition($1)", day)
        assert f"request_log_p{recent:%Y%m%d}" in await _partitions(owner)
        await learner.execute("SELECT request_log_drop_partition($1)", old)
        assert f"request_log_p{old:%Y%m%d}" not in await _partitions(owner)
        # Only the request log's partitions, and only those that exist.
        with pytest.raises(asyncpg.UndefinedTableError):
            await learner.execute("SELECT request_log_drop_partition($1)", old)
    finally:
        await learner.close()
    # The owner (`intentroute retention --hot-days N`) may drop any day.
    await owner.execute("SELECT request_log_drop_partition($1)", recent)
    assert f"request_log_p{recent:%Y%m%d}" not in await _partitions(owner)


def test_the_migration_downgrades_and_upgrades_again(deployment: Deployment) -> None:
    """0014's downgrade puts 0011's trigger function and 0009's drop function back."""
    from alembic import command

    async def definitions(url: str) -> tuple[bool, str, str]:
        conn = await asyncpg.connect(asyncpg_dsn(url))
        try:
            table = await conn.fetchval("SELECT to_regclass('owner_settings') IS NOT NULL")
            expire, drop = [await conn.fetchval(
                "SELECT pg_get_functiondef($1::regprocedure)", f)
                for f in ("sessions_expire_oldest()", "request_log_drop_partition(date)")]
            return table, expire, drop
        finally:
            await conn.close()

    with fresh_database(deployment.pg.url) as url:
        table, expire, drop = asyncio.run(definitions(url))
        assert table
        assert "owner_settings" in expire
        assert "owner keeps" in drop
        command.downgrade(alembic_config(url), "0013")
        table, expire, drop = asyncio.run(definitions(url))
        assert not table
        assert "current_setting('intentroute.max_sessions_per_agent'" in expire
        assert "owner keeps" not in drop
        command.upgrade(alembic_config(url), "head")
        assert asyncio.run(definitions(url))[0]


async def test_the_committed_table_is_what_the_server_grants(
        deployment: Deployment) -> None:
    rendered = await pg_permissions.render_live(deployment.pg.url)
    assert COMMITTED.read_text(encoding="utf-8") == rendered, REGENERATE


async def test_a_grant_the_table_does_not_list_fails_the_comparison(
        deployment: Deployment) -> None:
    """The check has teeth: a grant to a worker, to PUBLIC or to a role that is not
    the deployment's, or a new membership, changes the rendering (rolled back)."""
    committed = COMMITTED.read_text(encoding="utf-8")
    conn = await asyncpg.connect(asyncpg_dsn(deployment.pg.url))
    try:
        for grant in ("GRANT SELECT ON owner_settings TO intentroute_gateway",
                      "GRANT EXECUTE ON FUNCTION sessions_expire_oldest() TO PUBLIC",
                      "GRANT UPDATE (trusted) ON agents TO intentroute_validator",
                      "CREATE ROLE intruder; GRANT SELECT ON agents TO intruder",
                      "GRANT intentroute_owner TO intentroute_learner",
                      "ALTER DEFAULT PRIVILEGES FOR ROLE intentroute_owner "
                      "GRANT SELECT ON TABLES TO intentroute_retriever"):
            tx = conn.transaction()
            await tx.start()
            try:
                await conn.execute(grant)
                rendered = pg_permissions.render(
                    await pg_permissions.read_permissions(conn))
            finally:
                await tx.rollback()
            assert rendered != committed, grant
        assert pg_permissions.render(await pg_permissions.read_permissions(conn)) == committed
    finally:
        await conn.close()


def test_the_docs_command_writes_and_checks_the_table(
        deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`intentroute docs permissions-postgres [--check]` (on this test's server: the
    command deploys a throwaway one of its own)."""
    rendered = asyncio.run(pg_permissions.render_live(deployment.pg.url))
    monkeypatch.setattr(pg_permissions, "generate", lambda: rendered)
    out = tmp_path / "reference" / "permissions-postgres.md"
    runner = CliRunner()
    check = ["docs", "permissions-postgres", "--out", str(out), "--check"]
    assert runner.invoke(app, check).exit_code == 1
    written = runner.invoke(app, ["docs", "permissions-postgres", "--out", str(out)])
    assert written.exit_code == 0, written.output
    assert out.read_text(encoding="utf-8") == rendered
    assert runner.invoke(app, check).exit_code == 0
    out.write_text(rendered.replace("| `learner` |", "| `learner` | extra |", 1),
                   encoding="utf-8")
    assert runner.invoke(app, check).exit_code == 1
