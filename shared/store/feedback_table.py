"""Explicit feedback in the `feedback` table: one verdict per (agent, request).

The request must be in the agent's own request log: a request id it never sent (unknown,
or another agent's) stores nothing. A verdict replaces whatever was there, the implicit
outcome the pipeline recorded or an earlier explicit one (a repeat updates, it is never a
second row); metadata a repeat leaves out keeps its earlier value.
"""

from __future__ import annotations

from typing import NamedTuple

import asyncpg

from shared.contracts.feedback import Feedback, FeedbackSource
from shared.store.ports import StoreUnavailableError
from shared.store.writer import UNREACHABLE

# `old` reads the row as it was before this statement (a CTE sees the statement's
# starting snapshot), so one round trip says whether this was a repeat.
_SQL_RECORD = """
WITH known AS (
    SELECT 1 FROM request_log WHERE agent_id = $1 AND request_id = $2 LIMIT 1
), old AS (
    SELECT source FROM feedback WHERE agent_id = $1 AND request_id = $2
), stored AS (
    INSERT INTO feedback (agent_id, request_id, outcome, source, completion_quality,
                          latency_ms, token_count)
    SELECT $1, $2, $3, $7, $4, $5, $6 WHERE EXISTS (SELECT 1 FROM known)
    ON CONFLICT (agent_id, request_id) DO UPDATE SET
        outcome = EXCLUDED.outcome, source = EXCLUDED.source,
        completion_quality = COALESCE(EXCLUDED.completion_quality,
                                      feedback.completion_quality),
        latency_ms = COALESCE(EXCLUDED.latency_ms, feedback.latency_ms),
        token_count = COALESCE(EXCLUDED.token_count, feedback.token_count),
        updated_at = now()
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM stored) AS stored, (SELECT source FROM old) AS previous
"""


class Recorded(NamedTuple):
    # False: the request is not in this agent's request log (nothing stored).
    stored: bool
    # The source of the verdict it replaced ("" if none): "explicit" makes it a repeat.
    previous: str

    @property
    def repeat(self) -> bool:
        return self.stored and self.previous == FeedbackSource.EXPLICIT


class FeedbackTable:
    """The explicit side of the feedback table, over an asyncpg pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def record_explicit(self, agent_id: str, feedback: Feedback) -> Recorded:
        """Store the verdict if the request is the agent's; StoreUnavailableError when
        the database cannot be reached (retryable)."""
        meta = feedback.metadata
        try:
            row = await self.pool.fetchrow(
                _SQL_RECORD, agent_id, feedback.request_id, feedback.outcome.value,
                meta.completion_quality, meta.latency_ms, meta.token_count,
                FeedbackSource.EXPLICIT.value)
        except UNREACHABLE as exc:
            raise StoreUnavailableError(f"{type(exc).__name__}: {exc}") from exc
        assert row is not None  # the final SELECT always returns one row
        return Recorded(stored=bool(row["stored"]), previous=row["previous"] or "")
