"""The asyncpg-backed store the stages use: single indexed reads, and writes through
the group-commit writer (`shared.store.writer`), retried with backoff while the
database is unreachable, until the caller's deadline."""

from __future__ import annotations

import asyncio
import logging
import time

import asyncpg
from opentelemetry import trace
from opentelemetry.trace import Tracer

from shared.auth.identity import AgentSecret
from shared.auth.ports import AgentInfo
from shared.common.otel import request_attributes
from shared.contracts.routing import HISTORY_WINDOW, HistoryEntry, QueryType
from shared.store import asyncpg_dsn
from shared.store.ports import StoreError, StoreRejectedError, StoreUnavailableError
from shared.store.rows import HistoryRow, RequestLogRow, Row
from shared.store.writer import GroupCommitWriter

log = logging.getLogger("intentroute.store")


_SQL_AGENT = """
SELECT agent_id, secret_hash, secret_digest, trusted, revoked_at IS NOT NULL AS revoked
FROM agents WHERE agent_id = $1
"""
# Only while the hash is the one the digest was derived with (rotated meanwhile: no).
_SQL_SAVE_DIGEST = """
UPDATE agents SET secret_digest = $3 WHERE agent_id = $1 AND secret_hash = $2
"""
_SQL_LAST_HISTORY = """
SELECT type, topic FROM classify_history
WHERE agent_id = $1 AND session_id = $2
ORDER BY id DESC LIMIT $3
"""
_SQL_LAST_ANSWER = """
SELECT content FROM messages
WHERE agent_id = $1 AND session_id = $2 AND role = 'assistant'
ORDER BY id DESC LIMIT 1
"""
_SQL_LAST_TURNS = """
SELECT role, content FROM messages
WHERE agent_id = $1 AND session_id = $2
ORDER BY id DESC LIMIT $3
"""


async def _release_as_is(conn: asyncpg.Connection) -> None:
    """Pool release without asyncpg's reset query (a round trip per acquire): these
    connections keep no session state (no LISTEN, locks, SET or open cursors); one
    left inside a transaction by an error is still reset."""
    if conn.is_in_transaction():
        await conn.reset()


class AgentSecrets:
    """Agents' records with what their tokens are checked against, over a pool: the
    doors' token checks (shared.auth.identity.CachedAgents), and the fast digest they
    store after a bcrypt check."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def agent(self, agent_id: str) -> AgentSecret | None:
        """An agent's record and its secret's hash and digest (None: no such agent)."""
        row = await self.pool.fetchrow(_SQL_AGENT, agent_id)
        if row is None:
            return None
        info = AgentInfo(agent_id=row["agent_id"], trusted=row["trusted"],
                         revoked=row["revoked"])
        return AgentSecret(info, row["secret_hash"], row["secret_digest"])

    async def save_token_digest(self, agent_id: str, secret_hash: str, digest: str) -> None:
        """Store the digest of an agent's secret, checked with bcrypt against
        `secret_hash` (CachedAgents)."""
        await self.pool.execute(_SQL_SAVE_DIGEST, agent_id, secret_hash, digest)


class Store:
    """Reads and group-committed writes, all keyed by (agent_id, session_id)."""

    def __init__(self, pool: asyncpg.Pool, *, tracer: Tracer | None = None,
                 retry_for: float = 10.0, implicit_feedback: bool = True) -> None:
        self.pool = pool
        self.writer = GroupCommitWriter(pool, implicit_feedback=implicit_feedback)
        self._tracer = tracer or trace.NoOpTracer()
        # Seconds a write without a deadline keeps retrying an unreachable database.
        self.retry_for = retry_for

    @classmethod
    async def connect(
        cls,
        database_url: str,
        *,
        min_size: int = 1,
        max_size: int = 4,
        tracer: Tracer | None = None,
        implicit_feedback: bool = True,
    ) -> Store:
        """`implicit_feedback`: record the implicit outcome of every request-log row
        written (CommonSettings.accounting; shared.store.writer). The sessions an agent
        keeps (MAX_SESSIONS_PER_AGENT) are the database's, written by `migrate`
        (shared.store.owner_settings), not the connection's."""
        if not database_url:
            raise StoreUnavailableError("DATABASE_URL is not set")
        pool = await asyncpg.create_pool(
            asyncpg_dsn(database_url), min_size=min_size, max_size=max_size,
            reset=_release_as_is,
        )
        assert pool is not None
        return cls(pool, tracer=tracer, implicit_feedback=implicit_feedback)

    async def close(self) -> None:
        await self.writer.close()
        await self.pool.close()

    async def last_history(
        self, agent_id: str, session_id: str, n: int = HISTORY_WINDOW
    ) -> list[HistoryEntry]:
        """At most the last `n` (RC-06: 6) entries, oldest first."""
        n = min(n, HISTORY_WINDOW)
        with self._tracer.start_as_current_span("store.last_history"):
            rows = await self.pool.fetch(_SQL_LAST_HISTORY, agent_id, session_id, n)
        return [HistoryEntry(type=QueryType(r["type"]), topic=r["topic"]) for r in reversed(rows)]

    async def previous_answer(self, agent_id: str, session_id: str) -> str | None:
        with self._tracer.start_as_current_span("store.previous_answer"):
            answer: str | None = await self.pool.fetchval(_SQL_LAST_ANSWER, agent_id, session_id)
        return answer

    async def last_turns(self, agent_id: str, session_id: str, n: int = 4) -> list[tuple[str, str]]:
        rows = await self.pool.fetch(_SQL_LAST_TURNS, agent_id, session_id, n)
        return [(r["role"], r["content"]) for r in reversed(rows)]

    async def agent(self, agent_id: str) -> AgentSecret | None:
        """An agent's record and its secret's hash and digest (None: no such agent)."""
        return await AgentSecrets(self.pool).agent(agent_id)

    async def write(self, *rows: Row, deadline: float | None = None) -> None:
        """Returns once every row is committed. While the database is unreachable the
        write is retried with backoff until `deadline` (epoch seconds; default: a
        `retry_for` budget), then StoreUnavailableError; rows the database refuses
        raise StoreRejectedError at once (they would fail every time)."""
        until = deadline if deadline is not None else time.time() + self.retry_for
        delay = 0.05
        with self._tracer.start_as_current_span(
                "store.write", attributes={"rows": len(rows), **_row_attributes(rows)}):
            while True:
                try:
                    await self.writer.write(*rows)
                    return
                except StoreUnavailableError as exc:
                    if time.time() + delay > until:
                        raise
                    log.warning("store unreachable, retrying in %.2fs: %s", delay, exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 1.0)


def _row_attributes(rows: tuple[Row, ...]) -> dict[str, str]:
    """The span attributes of a turn's rows (its first row's request; the type and
    layer its history or request-log row carries)."""
    if not rows:
        return {}
    first = rows[0]
    query_type = layer = ""
    for row in rows:
        if isinstance(row, HistoryRow):
            query_type, layer = query_type or row.type, layer or row.layer
        elif isinstance(row, RequestLogRow):
            query_type, layer = query_type or row.query_type, layer or row.layer
    return request_attributes(first.request_id, first.agent_id, query_type, layer)


__all__ = ["AgentSecrets", "Store", "StoreError", "StoreRejectedError", "StoreUnavailableError"]
