"""Least privilege on a real Postgres: the init (as the superuser) makes the roles and
hands the database to the owner, the migrations run as the owner, each worker's role
runs its own stage's statements and is refused what it does not need, and a database
an older stack's superuser made is taken over on the next init."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import asyncpg
import pytest

from intentroute.stack import PostgresServer
from intentroute.stack.pgroles import (
    DatabaseUrls,
    database_urls,
    init_database,
    role_passwords,
    role_url,
)
from shared.contracts.feedback import Feedback, FeedbackOutcome
from shared.learning.job import learn_once
from shared.learning.settings import LearnSettings
from shared.policy.ab import load_candidates
from shared.store import asyncpg_dsn, migrate
from shared.store.feedback_table import FeedbackTable
from shared.store.partitions import (
    DEFAULT_PARTITION,
    drop_partitions_before,
    ensure_partitions,
    partition_days,
)
from shared.store.policies import load_policies
from shared.store.roles import OWNER_ROLE, ROLES, WORKER_ROLES
from shared.store.rows import HistoryRow, RequestLogRow, TurnRow
from shared.store.scores import refresh_scores
from shared.store.stores import AgentSecrets, Store
from tests.helpers.databases import alembic_config

pytestmark = pytest.mark.integration

# The stages' roles write turns through the group commit; the doors' reads tokens and the
# dashboard's figures and writes nothing but a token's digest.
STAGES = tuple(w for w in WORKER_ROLES if w != "doors")
EVERY_ROLE = (*STAGES, "doors", "learner")
# Tables no worker role touches: the owner's alone (owner_settings: the limits of its
# SECURITY DEFINER functions, migration 0014; the answer cache's sources, served requests
# and totals, written only through its functions, migration 0019).
OWNER_ONLY = {"alembic_version", "owner_settings", "answer_cache_sources",
              "answer_cache_served", "answer_cache_totals"}


class Deployment(NamedTuple):
    pg: PostgresServer
    urls: DatabaseUrls

    def url(self, who: str) -> str:
        return self.urls.learner if who == "learner" else self.urls.worker(who)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    pg = PostgresServer(tmp_path_factory.mktemp("pg-roles")).start()
    try:
        passwords = role_passwords(pg.data_dir)
        asyncio.run(init_database(pg.url, pg.DB, passwords))
        urls = database_urls(pg.url, passwords)
        migrate(urls.owner)
        yield Deployment(pg, urls)
    finally:
        pg.stop()


async def _connect(url: str) -> asyncpg.Connection:
    return await asyncpg.connect(asyncpg_dsn(url))


@pytest.fixture
async def superuser(deployment: Deployment) -> AsyncIterator[asyncpg.Connection]:
    conn = await _connect(deployment.pg.url)
    yield conn
    await conn.close()


async def test_roles_are_plain_and_the_owner_owns_the_schema(
        deployment: Deployment, superuser: asyncpg.Connection) -> None:
    rows = await superuser.fetch(
        "SELECT rolname, rolsuper, rolcreaterole, rolcreatedb, rolbypassrls, rolcanlogin "
        "FROM pg_roles WHERE rolname = ANY($1::text[])", list(ROLES))
    assert {r["rolname"] for r in rows} == set(ROLES)
    for row in rows:
        assert row["rolcanlogin"], row
        assert not row["rolsuper"], row
        assert not row["rolcreaterole"], row
        assert not row["rolcreatedb"], row
        assert not row["rolbypassrls"], row
    owners = await superuser.fetch(
        "SELECT c.relname, pg_get_userbyid(c.relowner) AS owner FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')")
    assert owners
    assert {r["owner"] for r in owners} == {OWNER_ROLE}, owners
    folder = deployment.pg.data_dir / "roles"
    assert folder.stat().st_mode & 0o777 == 0o700
    assert {p.name for p in folder.iterdir()} == set(ROLES)
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in folder.iterdir())


async def test_every_table_is_granted_to_the_roles_that_need_it(
        superuser: asyncpg.Connection) -> None:
    """A new table needs its grants in its migration (README Security): one no worker
    role may touch is listed here as the owner's alone."""
    tables = {r["relname"] for r in await superuser.fetch(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition")}
    granted = {r["table_name"] for r in await superuser.fetch(
        "SELECT DISTINCT table_name FROM information_schema.role_table_grants "
        "WHERE grantee = ANY($1::text[]) UNION SELECT DISTINCT table_name "
        "FROM information_schema.role_column_grants WHERE grantee = ANY($1::text[])",
        [r for r in ROLES if r != OWNER_ROLE])}
    assert tables - granted - OWNER_ONLY == set()


def _rows(agent: str, session: str, request_id: str) -> tuple[object, ...]:
    now = datetime.now(UTC).timestamp()
    return (
        HistoryRow(agent, session, request_id, "RETRIEVAL", "topic", "layer1", 0.9),
        TurnRow(agent, session, request_id, "a question", "an answer", "RETRIEVAL"),
        RequestLogRow(request_id=request_id, agent_id=agent, session_id=session,
                      outcome="answered", created_at=now),
    )


@pytest.mark.parametrize("worker", STAGES)
async def test_each_stage_writes_through_the_group_commit_and_reads_its_own(
        deployment: Deployment, worker: str) -> None:
    store = await Store.connect(deployment.url(worker))
    agent, session, request_id = f"role-{worker}", uuid.uuid4().hex, uuid.uuid4().hex
    try:
        await store.write(*_rows(agent, session, request_id))  # type: ignore[arg-type]
        # A rewrite of the log row (the upsert) and a row without a time (the lookup).
        await store.write(RequestLogRow(request_id=request_id, agent_id=agent,
                                        session_id=session, outcome="error:TIMEOUT"))
        if worker == "classifier":
            assert [h.topic for h in await store.last_history(agent, session)] == ["topic"]
        if worker == "retriever":
            assert await store.last_turns(agent, session) == [
                ("user", "a question"), ("assistant", "an answer")]
        if worker.startswith("generator"):
            assert await store.previous_answer(agent, session) == "an answer"
        if worker in ("gateway", "classifier", "generator-main", "generator-conversational"):
            await load_policies(store.pool)
            await load_candidates(store.pool)
    finally:
        await store.close()


async def test_the_gateway_admits_records_feedback_and_refreshes_scores(
        deployment: Deployment, superuser: asyncpg.Connection) -> None:
    agent, request_id = f"gw-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    await superuser.execute(
        "INSERT INTO agents (agent_id, secret_hash) VALUES ($1, 'hash')", agent)
    store = await Store.connect(deployment.url("gateway"))
    try:
        await store.write(*_rows(agent, "s", request_id))  # type: ignore[arg-type]
        found = await store.agent(agent)  # is it active, is it trusted
        assert found is not None
        recorded = await FeedbackTable(store.pool).record_explicit(
            agent, Feedback(request_id=request_id, outcome=FeedbackOutcome.SUCCESS))
        assert recorded.stored
        async with store.pool.acquire() as conn:
            await refresh_scores(conn, datetime.now(UTC), agents=[agent])
    finally:
        await store.close()


async def test_the_doors_check_tokens_and_store_a_tokens_digest(
        deployment: Deployment, superuser: asyncpg.Connection) -> None:
    agent = f"door-{uuid.uuid4().hex[:8]}"
    await superuser.execute(
        "INSERT INTO agents (agent_id, secret_hash) VALUES ($1, 'hash')", agent)
    pool = await asyncpg.create_pool(asyncpg_dsn(deployment.url("doors")), min_size=0,
                                     max_size=1)
    assert pool is not None
    try:
        secrets = AgentSecrets(pool)
        found = await secrets.agent(agent)
        assert found is not None
        assert found.secret_hash == "hash"
        await secrets.save_token_digest(agent, "hash", "digest")
        assert await pool.fetchval("SELECT 1") == 1  # the readiness check
    finally:
        await pool.close()
    assert await superuser.fetchval(
        "SELECT secret_digest FROM agents WHERE agent_id = $1", agent) == "digest"


async def test_the_dashboard_reads_its_figures_as_the_doors(deployment: Deployment) -> None:
    from services.doors.dashboard.queries import read_figures
    from services.doors.dashboard.rows import Window

    pool = await asyncpg.create_pool(asyncpg_dsn(deployment.url("doors")), min_size=0,
                                     max_size=2)
    assert pool is not None
    try:
        await read_figures(pool, Window.ending(datetime.now(UTC).date(), 7))
    finally:
        await pool.close()


async def test_the_learner_runs_the_job_and_keeps_the_partitions(
        deployment: Deployment, superuser: asyncpg.Connection) -> None:
    """The learner creates and drops the log's day partitions through the owner's
    functions (it may not CREATE or DROP itself; it drops only days past the owner's
    30-day hot window, migration 0014), and runs every phase of the job."""
    day = (datetime.now(UTC) - timedelta(days=40)).replace(hour=12)
    await superuser.execute(
        "INSERT INTO request_log (agent_id, request_id, session_id, outcome, created_at) "
        "VALUES ('learn', $1, 's', 'answered', $2)", uuid.uuid4().hex, day)
    conn = await _connect(deployment.url("learner"))
    try:
        assert day.date() not in await partition_days(conn)
        made = await ensure_partitions(conn, [])  # the day's row waited in the DEFAULT one
        assert made == {"created": 1, "moved_from_default": 1}
        assert day.date() in await partition_days(conn)
        assert await conn.fetchval(f"SELECT count(*) FROM {DEFAULT_PARTITION}") == 0
        dropped, _ = await drop_partitions_before(conn, day.date() + timedelta(days=1))
        assert dropped == [day.date()]
        assert day.date() not in await partition_days(conn)
    finally:
        await conn.close()
    summary = await learn_once(deployment.url("learner"), LearnSettings())
    assert summary["ran"], summary
    assert summary["ok"], summary


# (who, statement): each refused with "permission denied" or "must be owner".
REFUSED = [
    *[(w, "SELECT secret_hash FROM agents") for w in (*STAGES, "learner")
      if w != "gateway"],
    *[(w, "SELECT agent_id FROM agents") for w in (*STAGES, "learner") if w != "gateway"],
    ("gateway", "UPDATE agents SET trusted = true"),
    ("gateway", "UPDATE agents SET secret_hash = 'x'"),
    ("gateway", "DELETE FROM agents"),
    ("gateway", "SELECT content FROM messages"),
    # The doors write no turn, no verdict, no policy; they read no conversation.
    ("doors", "INSERT INTO request_log (agent_id, request_id, session_id, outcome) "
              "VALUES ('a', 'r', 's', 'o')"),
    ("doors", "INSERT INTO feedback (agent_id, request_id, outcome, source) "
              "VALUES ('a', 'r', 'success', 'explicit')"),
    ("doors", "SELECT content FROM messages"),
    ("doors", "SELECT topic FROM classify_history"),
    ("doors", "UPDATE agents SET trusted = true"),
    ("doors", "UPDATE agents SET revoked_at = now()"),
    ("doors", "DELETE FROM agent_leases"),
    ("doors", "UPDATE agent_policies SET settings = '{}'"),
    *[(w, "DELETE FROM request_log") for w in STAGES],
    # The writer's upsert updates a log row's figures, never whose or which row it is.
    *[(w, "UPDATE request_log SET agent_id = 'x'") for w in STAGES],
    *[(w, "UPDATE request_log SET created_at = now()") for w in STAGES],
    ("classifier", "SELECT content FROM messages"),
    ("validator", "SELECT content FROM messages"),
    ("retriever", "SELECT topic FROM classify_history"),
    ("validator", "SELECT topic FROM classify_history"),
    ("retriever", "SELECT settings FROM agent_policies"),
    ("validator", "SELECT session_id FROM request_log"),
    ("validator", "SELECT * FROM request_log"),
    ("classifier", "SELECT outcome FROM feedback"),
    ("generator-main", "DELETE FROM sessions"),
    ("classifier", "INSERT INTO agent_policies (agent_id) VALUES ('x')"),
    ("learner", "SELECT content FROM messages"),
    ("learner", "INSERT INTO request_log (agent_id, request_id, session_id, outcome) "
                "VALUES ('a', 'r', 's', 'o')"),
    *[(w, "SELECT request_log_create_partition(current_date + 400)") for w in STAGES],
    *[(w, "SELECT request_log_drop_partition(current_date)") for w in STAGES],
    *[(w, statement) for w in EVERY_ROLE for statement in (
        "CREATE TABLE intruder (a int)",
        "CREATE TEMP TABLE intruder (a int)",
        "CREATE FUNCTION intruder() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "DROP TABLE sessions",
        "ALTER TABLE request_log ADD COLUMN intruder int",
        "TRUNCATE request_log",
        "SELECT rolpassword FROM pg_authid",
        "CREATE ROLE intruder",
        "CREATE SCHEMA intruder",
        "GRANT SELECT ON agents TO PUBLIC",
    )],
]


@pytest.mark.parametrize(("who", "statement"), REFUSED,
                         ids=[f"{w}: {s[:40]}" for w, s in REFUSED])
async def test_a_role_is_refused_what_its_stage_does_not_need(
        deployment: Deployment, who: str, statement: str) -> None:
    conn = await _connect(deployment.url(who))
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute(statement)
    finally:
        await conn.close()


async def test_an_unknown_role_cannot_connect(deployment: Deployment) -> None:
    """Only the deployment's roles may connect to its database (CONNECT revoked from
    PUBLIC): a role made for something else on the same server is refused."""
    su = await _connect(deployment.pg.url)
    try:
        await su.execute("DROP ROLE IF EXISTS stranger")
        await su.execute("CREATE ROLE stranger LOGIN PASSWORD 'stranger-pw'")
    finally:
        await su.close()
    stranger = role_url(deployment.urls.owner, "stranger", "stranger-pw")
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await asyncpg.connect(asyncpg_dsn(stranger))


def test_an_older_stacks_database_is_taken_over(tmp_path: Path) -> None:
    """A state dir from before the roles: the superuser made and migrated everything.
    The next init hands it to the owner, whose migrations then apply; the workers'
    roles work on the old rows' tables."""
    from alembic import command

    pg = PostgresServer(tmp_path / "pg").start()
    try:
        command.upgrade(alembic_config(pg.url), "0008")  # as the superuser, as before

        async def old_rows() -> None:
            conn = await _connect(pg.url)
            try:
                await conn.execute("INSERT INTO sessions (agent_id, session_id) "
                                   "VALUES ('old', 's')")
            finally:
                await conn.close()

        asyncio.run(old_rows())
        passwords = role_passwords(pg.data_dir)
        asyncio.run(init_database(pg.url, pg.DB, passwords))
        urls = database_urls(pg.url, passwords)
        migrate(urls.owner)

        async def as_roles() -> tuple[str, int]:
            su = await _connect(pg.url)
            try:
                owners = await su.fetch(
                    "SELECT DISTINCT pg_get_userbyid(c.relowner) AS owner FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')")
            finally:
                await su.close()
            store = await Store.connect(urls.worker("validator"))
            try:
                await store.write(*_rows("old", "s", uuid.uuid4().hex))  # type: ignore[arg-type]
            finally:
                await store.close()
            learned = await learn_once(urls.learner, LearnSettings())
            assert learned["ok"], learned
            conn = await _connect(urls.owner)
            try:
                return ",".join(r["owner"] for r in owners), await conn.fetchval(
                    "SELECT count(*) FROM messages WHERE agent_id = 'old'")
            finally:
                await conn.close()

        assert asyncio.run(as_roles()) == (OWNER_ROLE, 2)
        # The init again (every `up` runs it): nothing to do, nothing broken.
        asyncio.run(init_database(pg.url, pg.DB, role_passwords(pg.data_dir)))
        migrate(urls.owner)
    finally:
        pg.stop()
