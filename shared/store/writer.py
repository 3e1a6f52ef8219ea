"""Group commit: concurrent callers' rows written in one statement per round trip.

Callers await their rows; a batch is one `INSERT ... WITH` statement (one implicit
transaction), so nothing is acknowledged before it is stored and under load many
requests share one round trip. A failure is sorted:

* the database is unreachable (connection refused, dropped, shutting down): every
  caller of the batch gets StoreUnavailableError, which they retry (the store does,
  with backoff, until their deadline);
* the database refuses the statement (a value it cannot hold, a constraint): the batch
  is retried caller by caller, so only the callers whose rows are bad fail, with
  StoreRejectedError (permanent: retrying the same rows cannot help);
* anything else (a bug) fails the batch's callers with StoreError; the writer itself
  never dies.

With `implicit_feedback` (CommonSettings.accounting) the same statement records, for
each request-log row whose answer the pipeline knows went wrong (`implicit_outcome`:
fallback, timeout, error, INVALID_UNRESOLVED), that outcome in the `feedback` table as
an implicit verdict, unless the request has one already: an agent's explicit feedback
always stands, whichever comes first. A plain answer's implicit success is not written:
it is what the request-log row already says (`shared.store.scores.OUTCOME_SQL` reads it
from there), and a row for every request would double the writes of the hot path.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any

import asyncpg

from shared.common.tasks import cancel_and_wait
from shared.contracts.feedback import FeedbackOutcome, FeedbackSource
from shared.contracts.response import ErrorCode, ValidationStatus
from shared.store.ports import StoreError, StoreRejectedError, StoreUnavailableError
from shared.store.rows import HistoryRow, RequestLogRow, Row, TurnRow

log = logging.getLogger("intentroute.store")


# Errors that say nothing about the rows: the connection or the server is the problem.
_UNREACHABLE = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.OperatorInterventionError,
    # The connection's protocol state broke when the server went away mid-statement
    # (asyncpg issue #1069; seen as Postgres shut down under load in test_up_kill9).
    asyncpg.InternalClientError,
)
# For other asyncpg callers (shared.store.feedback_table): the same sorting.
UNREACHABLE = _UNREACHABLE

# One statement writes a whole batch: one round trip and one implicit transaction,
# where BEGIN + an executemany per table + COMMIT took six. Arrays keep their order
# (WITH ORDINALITY), so ids follow the order the rows were written in.
#
# request_log is partitioned by day on created_at, so its key is (agent_id, request_id,
# created_at) and the upsert can only meet a row with the same created_at. Every write
# of one run of a request carries the same one: its admission time from the envelope
# (`RequestLogRow.created_at`), so the stages' writes of that run meet, in the same
# partition, and nothing else does. A row without one (input the gateway rejected, a
# duplicate request id: no envelope) is an event of its own at now(): a message naming
# a request id never rewrites what was logged or billed for it (before, such a row took
# the existing row's time and overwrote an answered row with its error). A day without
# its partition lands in the DEFAULT partition, so no write fails for a missing
# partition.
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
), implicit_feedback AS (
    INSERT INTO feedback (agent_id, request_id, outcome, source, latency_ms, token_count)
    SELECT a, r, o, $43::text, lm, tc
    FROM unnest($38::text[], $39::text[], $40::text[], $41::float8[], $42::int4[])
        AS u(a, r, o, lm, tc)
    ON CONFLICT (agent_id, request_id) DO NOTHING
)
INSERT INTO request_log
    (request_id, agent_id, session_id, query_type, layer, confidence, model_slot,
     answered_by, stage_ms, total_ms, outcome, validation_status, retried,
     model, tokens_in, tokens_out, tokens_note, first_chunk_ms, compute_ms, fallback,
     fallback_reason, created_at, model_parts)
SELECT r, a, s, t, l, c, ms, ab, sm::jsonb, tm, o, vs, rt, mo, ti, tt, tn, fc, cm, fb, fr,
       COALESCE(to_timestamp(ca), now()), mp::jsonb
FROM unnest($16::text[], $17::text[], $18::text[], $19::text[], $20::text[], $21::float8[],
            $22::text[], $23::text[], $24::text[], $25::float8[], $26::text[], $27::text[],
            $28::bool[], $29::text[], $30::int4[], $31::int4[], $32::text[],
            $33::float8[], $34::float8[], $35::bool[], $36::text[], $37::float8[],
            $44::text[])
    AS u(r, a, s, t, l, c, ms, ab, sm, tm, o, vs, rt, mo, ti, tt, tn, fc, cm, fb, fr, ca, mp)
ON CONFLICT (agent_id, request_id, created_at) DO UPDATE SET
    query_type = EXCLUDED.query_type, layer = EXCLUDED.layer,
    confidence = EXCLUDED.confidence, model_slot = EXCLUDED.model_slot,
    answered_by = EXCLUDED.answered_by, stage_ms = EXCLUDED.stage_ms,
    total_ms = EXCLUDED.total_ms, outcome = EXCLUDED.outcome,
    validation_status = EXCLUDED.validation_status, retried = EXCLUDED.retried,
    model = EXCLUDED.model, tokens_in = EXCLUDED.tokens_in,
    tokens_out = EXCLUDED.tokens_out, tokens_note = EXCLUDED.tokens_note,
    first_chunk_ms = EXCLUDED.first_chunk_ms, compute_ms = EXCLUDED.compute_ms,
    fallback = EXCLUDED.fallback, fallback_reason = EXCLUDED.fallback_reason,
    model_parts = EXCLUDED.model_parts
"""
# Errors caused by the caller's own input or credential: they say nothing about how well
# the pipeline serves the agent, so they leave no implicit outcome.
_CALLER_ERRORS = frozenset({
    ErrorCode.MALFORMED_JSON, ErrorCode.MISSING_FIELD, ErrorCode.INVALID_FIELD,
    ErrorCode.OVERSIZED_FIELD, ErrorCode.UNKNOWN_QUERY_TYPE, ErrorCode.AGENT_MISMATCH,
    ErrorCode.UNKNOWN_AGENT, ErrorCode.DUPLICATE_REQUEST,
    # Refused at admission by the agent's own limits: nothing was answered.
    ErrorCode.RATE_LIMITED, ErrorCode.CONCURRENCY_LIMITED, ErrorCode.QUOTA_EXCEEDED,
    ErrorCode.BUDGET_EXCEEDED,
})
_ERROR_PREFIX = "error:"


def implicit_outcome(row: RequestLogRow) -> FeedbackOutcome | None:
    """The outcome the pipeline itself knows for a request-log row, or None when it
    knows none: a clarification (nothing was answered) or an error in the caller's own
    input. A plain answer is a success (docs/explanation/agent-confidence.md,
    "Implicit outcomes")."""
    if row.outcome.startswith(_ERROR_PREFIX):
        code = row.outcome[len(_ERROR_PREFIX):]
        if code == ErrorCode.DEADLINE_EXCEEDED:
            return FeedbackOutcome.TIMEOUT
        return None if code in _CALLER_ERRORS else FeedbackOutcome.ERROR
    if row.outcome != "ok":
        return None
    if row.fallback:
        return FeedbackOutcome.FALLBACK
    if row.validation_status == ValidationStatus.INVALID_UNRESOLVED:
        return FeedbackOutcome.ERROR
    return FeedbackOutcome.SUCCESS


def _implicit_row(row: RequestLogRow) -> tuple[Any, ...] | None:
    """The feedback row of an answer that went wrong (module doc), else None."""
    outcome = implicit_outcome(row)
    if outcome is None or outcome == FeedbackOutcome.SUCCESS:
        return None
    tokens = row.tokens_in + row.tokens_out
    return (row.agent_id, row.request_id, outcome.value, row.total_ms,
            tokens if tokens > 0 else None)


def _columns(rows: Sequence[tuple[Any, ...]], width: int) -> list[list[Any]]:
    return [list(col) for col in zip(*rows, strict=True)] if rows else [[] for _ in range(width)]


async def _write_batch(
    conn: asyncpg.Connection, rows: Sequence[Row], *, implicit_feedback: bool = True
) -> None:
    sessions: dict[tuple[str, str], None] = {}
    history: list[tuple[Any, ...]] = []
    messages: list[tuple[Any, ...]] = []
    # One log row per run of a request (the latest wins): ON CONFLICT DO UPDATE may not
    # touch a row twice in one statement. Runs, and rows of their own (created_at None),
    # are kept apart: one never replaces another's row.
    logs: dict[tuple[str, str, float | None], tuple[Any, ...]] = {}
    implicit: dict[tuple[str, str, float | None], tuple[Any, ...] | None] = {}
    parts: dict[tuple[str, str, float | None], str | None] = {}
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
            key = (row.agent_id, row.request_id, row.created_at)
            logs.pop(key, None)
            logs[key] = (
                row.request_id, row.agent_id, row.session_id, row.query_type, row.layer,
                row.confidence, row.model_slot, row.answered_by, json.dumps(row.stage_ms),
                row.total_ms, row.outcome, row.validation_status, row.retried,
                row.model, row.tokens_in, row.tokens_out, row.tokens_note,
                row.first_chunk_ms, row.compute_ms, row.fallback, row.fallback_reason,
                row.created_at,
            )
            parts[key] = json.dumps(row.model_parts) if row.model_parts else None
            if implicit_feedback:
                implicit.pop(key, None)
                implicit[key] = _implicit_row(row)
    await conn.execute(
        _SQL_BATCH,
        # In one order in every batch: each worker's writer upserts sessions, and two
        # batches locking the same sessions in opposite orders would deadlock.
        *_columns(sorted(sessions), 2),
        *_columns(history, 7),
        *_columns(messages, 6),
        *_columns(list(logs.values()), 22),
        *_columns([f for f in implicit.values() if f is not None], 5),
        FeedbackSource.IMPLICIT.value,
        [parts[key] for key in logs],
    )


Pending = tuple[tuple[Row, ...], "asyncio.Future[None]"]


class GroupCommitWriter:
    """Batches rows from concurrent callers into one statement per round trip."""

    def __init__(
        self, pool: asyncpg.Pool, *, max_batch: int = 256, implicit_feedback: bool = True
    ) -> None:
        self._pool = pool
        self._queue: asyncio.Queue[Pending] = asyncio.Queue()
        self._max_batch = max_batch
        # Record implicit outcomes of request-log rows (CommonSettings.accounting).
        self.implicit_feedback = implicit_feedback
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="group-commit-writer")

    async def write(self, *rows: Row) -> None:
        """Returns once every row is committed (one attempt; see the module doc)."""
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
                # A driver bug or a row the code cannot encode: the callers of this
                # batch get an error and the writer goes on (a dead writer would leave
                # every later write waiting forever).
                log.exception("store write failed unexpectedly")
                _fail(batch, StoreError(f"write failed: {exc!r}"))
            finally:
                for _ in batch:
                    self._queue.task_done()

    async def _execute(self, rows: Sequence[Row]) -> None:
        async with self._pool.acquire() as conn:
            try:
                await _write_batch(conn, rows, implicit_feedback=self.implicit_feedback)
            except asyncpg.InternalClientError:
                conn.terminate()  # never handed out again in that state
                raise

    async def _flush(self, batch: list[Pending]) -> None:
        try:
            await self._execute([row for rows, _ in batch for row in rows])
        except _UNREACHABLE as exc:
            _fail(batch, StoreUnavailableError(f"{type(exc).__name__}: {exc}"))
            return
        except asyncpg.PostgresError as exc:
            if len(batch) == 1:
                _fail(batch, StoreRejectedError(
                    f"the turn could not be stored: {type(exc).__name__}: {exc}"))
                return
            # One caller's rows poisoned the statement: find whose, one by one.
            log.warning("batch of %d refused (%s); retrying caller by caller", len(batch), exc)
            for pending in batch:
                await self._flush([pending])
            return
        for _, fut in batch:
            if not fut.done():
                fut.set_result(None)

    async def close(self) -> None:
        """Flush what is queued, then stop."""
        if self._task is None:
            return
        await self._queue.join()
        await cancel_and_wait(self._task)
        self._task = None


def _fail(batch: list[Pending], error: Exception) -> None:
    for _, fut in batch:
        if not fut.done():
            fut.set_exception(error)
