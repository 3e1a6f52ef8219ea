"""asyncpg-backed stores with group commit.

Reads are single indexed queries. Writes go through `GroupCommitWriter`: callers
await their row, concurrent rows are written in one transaction, so under load
many requests share one round trip and nothing is acknowledged before it is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Sequence
from typing import Any

import asyncpg
from opentelemetry import trace
from opentelemetry.trace import Tracer

from shared.contracts.routing import HISTORY_WINDOW, HistoryEntry, QueryType
from shared.ports import AgentInfo
from shared.store import asyncpg_dsn
from shared.store.rows import HistoryRow, Row, TurnRow

log = logging.getLogger("intentroute.store")



# One statement writes a whole batch: one round trip and one implicit transaction,
# where BEGIN + an executemany per table + COMMIT took six. Arrays keep their order
# (WITH ORDINALITY), so ids follow the order the rows were written in.
_SQL_BATCH = """
WITH new_sessions AS (
    INSERT INTO sessions (agent_id, session_id)
    SELECT * FROM unnest($1::text[], $2::text[])
    ON CONFLICT (agent_id, session_id) DO UPDATE SET updated_at = now()
), new_history AS (
    INSERT INTO classify_history
        (agent_id, session_id, request_id, type, topic, layer, confidence)
    SELECT a, s, r, t, tp, l, c
    FROM unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
                $9::float8[]) WITH ORDINALITY AS u(a, s, r, t, tp, l, c, n)
    ORDER BY n
    ON CONFLICT (agent_id, request_id) DO NOTHING
), new_messages AS (
    INSERT INTO messages (agent_id, session_id, request_id, role, content, query_type)
    SELECT a, s, r, ro, co, t
    FROM unnest($10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::text[])
        WITH ORDINALITY AS u(a, s, r, ro, co, t, n)
    ORDER BY n
    ON CONFLICT (agent_id, request_id, role) DO NOTHING
)
INSERT INTO request_log
    (request_id, agent_id, session_id, query_type, layer, confidence, model_slot,
     answered_by, stage_ms, total_ms, outcome, validation_status, retried)
SELECT r, a, s, t, l, c, ms, ab, sm::jsonb, tm, o, vs, rt
FROM unnest($16::text[], $17::text[], $18::text[], $19::text[], $20::text[], $21::float8[],
            $22::text[], $23::text[], $24::text[], $25::float8[], $26::text[], $27::text[],
            $28::bool[]) AS u(r, a, s, t, l, c, ms, ab, sm, tm, o, vs, rt)
ON CONFLICT (agent_id, request_id) DO UPDATE SET
    query_type = EXCLUDED.query_type, layer = EXCLUDED.layer,
    confidence = EXCLUDED.confidence, model_slot = EXCLUDED.model_slot,
    answered_by = EXCLUDED.answered_by, stage_ms = EXCLUDED.stage_ms,
    total_ms = EXCLUDED.total_ms, outcome = EXCLUDED.outcome,
    validation_status = EXCLUDED.validation_status, retried = EXCLUDED.retried
"""
_SQL_AGENT = """
SELECT agent_id, secret_hash, trusted, revoked_at IS NOT NULL AS revoked
FROM agents WHERE agent_id = $1
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


def _columns(rows: Sequence[tuple[Any, ...]], width: int) -> list[list[Any]]:
    return [list(col) for col in zip(*rows, strict=True)] if rows else [[] for _ in range(width)]


async def _write_batch(conn: asyncpg.Connection, rows: Sequence[Row]) -> None:
    sessions: dict[tuple[str, str], None] = {}
    history: list[tuple[Any, ...]] = []
    messages: list[tuple[Any, ...]] = []
    # One log row per request (the latest wins): ON CONFLICT DO UPDATE may not touch
    # a row twice in one statement.
    logs: dict[tuple[str, str], tuple[Any, ...]] = {}
    for row in rows:
        if isinstance(row, HistoryRow):
            history.append(
                (row.agent_id, row.session_id, row.request_id, row.type,
                 row.topic[:60], row.layer, row.confidence)
            )
        elif isinstance(row, TurnRow):
            sessions[(row.agent_id, row.session_id)] = None
            messages.append(
                (row.agent_id, row.session_id, row.request_id, "user", row.query,
                 row.query_type)
            )
            messages.append(
                (row.agent_id, row.session_id, row.request_id, "assistant", row.answer,
                 row.query_type)
            )
        else:
            key = (row.agent_id, row.request_id)
            logs.pop(key, None)
            logs[key] = (
                row.request_id, row.agent_id, row.session_id, row.query_type, row.layer,
                row.confidence, row.model_slot, row.answered_by, json.dumps(row.stage_ms),
                row.total_ms, row.outcome, row.validation_status, row.retried,
            )
    await conn.execute(
        _SQL_BATCH,
        *_columns(list(sessions), 2),
        *_columns(history, 7),
        *_columns(messages, 6),
        *_columns(list(logs.values()), 13),
    )


class GroupCommitWriter:
    """Batches rows from concurrent callers into one statement per round trip."""

    def __init__(self, pool: asyncpg.Pool, *, max_batch: int = 256, retries: int = 3) -> None:
        self._pool = pool
        self._queue: asyncio.Queue[tuple[tuple[Row, ...], asyncio.Future[None]]] = (
            asyncio.Queue()
        )
        self._max_batch = max_batch
        self._retries = retries
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="group-commit-writer")

    async def write(self, *rows: Row) -> None:
        """Returns once every row is committed; raises if the store keeps failing."""
        self.start()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((rows, fut))
        await fut

    async def _run(self) -> None:
        while True:
            first = await self._queue.get()
            batch = [first]
            while len(batch) < self._max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                await self._flush(batch)
            except Exception as exc:
                # Whatever failed (a driver bug, a row the code cannot encode), the
                # callers of this batch get an error and the writer goes on: a dead
                # writer would leave every later write waiting forever.
                log.exception("store write failed unexpectedly")
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(StoreUnavailableError(f"write failed: {exc!r}"))
            finally:
                for _ in batch:
                    self._queue.task_done()

    async def _flush(self, batch: list[tuple[tuple[Row, ...], asyncio.Future[None]]]) -> None:
        error: BaseException | None = None
        for attempt in range(self._retries):
            try:
                async with self._pool.acquire() as conn:
                    await _write_batch(conn, [row for rows, _ in batch for row in rows])
                error = None
                break
            except (asyncpg.PostgresError, OSError, asyncpg.InterfaceError) as exc:
                error = exc
                log.warning("store write failed (attempt %d): %s", attempt + 1, exc)
                await asyncio.sleep(0.05 * 2**attempt)
        for _, fut in batch:
            if fut.done():
                continue
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(StoreUnavailableError(str(error)))

    async def close(self) -> None:
        """Flush what is queued, then stop."""
        if self._task is None:
            return
        await self._queue.join()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None


async def _release_as_is(conn: asyncpg.Connection) -> None:
    """Pool release without asyncpg's reset query (a round trip per acquire): these
    connections keep no session state (no LISTEN, locks, SET or open cursors); one
    left inside a transaction by an error is still reset."""
    if conn.is_in_transaction():
        await conn.reset()


class StoreUnavailableError(Exception):
    """The store could not take a write after retries (retryable by redelivery)."""


class Store:
    """Reads and group-committed writes, all keyed by (agent_id, session_id)."""

    def __init__(self, pool: asyncpg.Pool, *, tracer: Tracer | None = None) -> None:
        self.pool = pool
        self.writer = GroupCommitWriter(pool)
        self._tracer = tracer or trace.NoOpTracer()

    @classmethod
    async def connect(
        cls,
        database_url: str,
        *,
        min_size: int = 1,
        max_size: int = 4,
        tracer: Tracer | None = None,
    ) -> Store:
        if not database_url:
            raise StoreUnavailableError("DATABASE_URL is not set")
        pool = await asyncpg.create_pool(
            asyncpg_dsn(database_url), min_size=min_size, max_size=max_size,
            reset=_release_as_is,
        )
        assert pool is not None
        return cls(pool, tracer=tracer)

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

    async def agent(self, agent_id: str) -> tuple[AgentInfo, str] | None:
        """An agent's record and the bcrypt hash of its secret (None: no such agent)."""
        row = await self.pool.fetchrow(_SQL_AGENT, agent_id)
        if row is None:
            return None
        info = AgentInfo(agent_id=row["agent_id"], trusted=row["trusted"],
                         revoked=row["revoked"])
        return info, row["secret_hash"]

    async def write(self, *rows: Row) -> None:
        with self._tracer.start_as_current_span("store.write", attributes={"rows": len(rows)}):
            await self.writer.write(*rows)
