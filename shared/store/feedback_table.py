"""Explicit feedback in the `feedback` table: one verdict per (agent, request), and one per
(agent, part) of a message answered part by part.

The request must be in the agent's own request log: a request id it never sent (unknown,
or another agent's) stores nothing. A verdict on a part (`Feedback.part`, from 0) is
stored under the part's id, `<request_id>#<place from 1>` (shared.contracts.ids.part_id),
the id of the part's classify_history entry, which must exist: a request answered whole,
or a part past its last, stores nothing either, and says so (`Recorded.no_such_part`).
A verdict replaces whatever was there, the implicit outcome the pipeline recorded or an
earlier explicit one (a repeat updates, it is never a second row); metadata a repeat
leaves out keeps its earlier value. A verdict on the whole request and verdicts on its
parts are separate rows: how they add up to the request's outcome is `VERDICTS_SQL`'s.
"""

from __future__ import annotations

from typing import NamedTuple

import asyncpg

from shared.contracts.feedback import Feedback, FeedbackOutcome, FeedbackSource
from shared.contracts.ids import PART_MARK, part_id
from shared.store.ports import StoreUnavailableError
from shared.store.writer import UNREACHABLE

# `old` reads the row as it was before this statement (a CTE sees the statement's
# starting snapshot), so one round trip says whether this was a repeat. $8 is the stored
# id: the request's own ($2), or one of its parts', which must have its classify_history
# entry (written in the same statement as the request-log row).
_SQL_RECORD = """
WITH known AS (
    SELECT 1 FROM request_log WHERE agent_id = $1 AND request_id = $2 LIMIT 1
), target AS (
    SELECT 1 WHERE EXISTS (SELECT 1 FROM known) AND ($8::text = $2::text OR EXISTS (
        SELECT 1 FROM classify_history WHERE agent_id = $1 AND request_id = $8))
), old AS (
    SELECT source FROM feedback WHERE agent_id = $1 AND request_id = $8
), stored AS (
    INSERT INTO feedback (agent_id, request_id, outcome, source, completion_quality,
                          latency_ms, token_count)
    SELECT $1, $8, $3, $7, $4, $5, $6 WHERE EXISTS (SELECT 1 FROM target)
    ON CONFLICT (agent_id, request_id) DO UPDATE SET
        outcome = EXCLUDED.outcome, source = EXCLUDED.source,
        completion_quality = COALESCE(EXCLUDED.completion_quality,
                                      feedback.completion_quality),
        latency_ms = COALESCE(EXCLUDED.latency_ms, feedback.latency_ms),
        token_count = COALESCE(EXCLUDED.token_count, feedback.token_count),
        updated_at = now()
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM known) AS known, EXISTS (SELECT 1 FROM stored) AS stored,
       (SELECT source FROM old) AS previous
"""

# The verdicts on a request, for what learns from them (shared.store.scores,
# shared.learning): `request_log r` with `f`, the row of the request itself (the agent's
# verdict on the whole request, or the implicit outcome the pipeline recorded), and `p`,
# the agent's verdicts on its parts folded into one: `success` when every part it judged
# was one, else the first other outcome by name (NULL: no part judged). How they rank is
# the readers' (`OUTCOME_SQL`): a verdict on the whole request first, then a part judged
# anything but a success (part of the message went unanswered), then what the pipeline
# knows. Part verdicts are read through ix_feedback_parts (migration 0020), which holds
# those rows only.
_SUCCESS = FeedbackOutcome.SUCCESS.value
PART_VERDICTS_SQL = f"""(
    SELECT agent_id, left(request_id, strpos(request_id, '{PART_MARK}') - 1) AS request_id,
           CASE WHEN bool_and(outcome = '{_SUCCESS}') THEN '{_SUCCESS}'
                ELSE min(outcome) FILTER (WHERE outcome <> '{_SUCCESS}') END AS outcome,
           max(updated_at) AS updated_at
    FROM feedback WHERE strpos(request_id, '{PART_MARK}') > 0
    GROUP BY 1, 2
)"""
VERDICTS_SQL = (
    "request_log r"
    " LEFT JOIN feedback f ON f.agent_id = r.agent_id AND f.request_id = r.request_id"
    f" LEFT JOIN {PART_VERDICTS_SQL} p"
    " ON p.agent_id = r.agent_id AND p.request_id = r.request_id")


class Recorded(NamedTuple):
    # False: the request is not in this agent's request log, or has no such part
    # (nothing stored).
    stored: bool
    # The source of the verdict it replaced ("" if none): "explicit" makes it a repeat.
    previous: str
    # The request is in the agent's request log.
    known: bool = False

    @property
    def repeat(self) -> bool:
        return self.stored and self.previous == FeedbackSource.EXPLICIT

    @property
    def no_such_part(self) -> bool:
        """The request is the agent's, and the part the verdict names is not one of its
        parts (it was answered whole, or has fewer)."""
        return self.known and not self.stored


class FeedbackTable:
    """The explicit side of the feedback table, over an asyncpg pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def record_explicit(self, agent_id: str, feedback: Feedback) -> Recorded:
        """Store the verdict if the request (and the part it names) is the agent's;
        StoreUnavailableError when the database cannot be reached (retryable)."""
        meta = feedback.metadata
        target = (feedback.request_id if feedback.part is None
                  else part_id(feedback.request_id, feedback.part))
        try:
            row = await self.pool.fetchrow(
                _SQL_RECORD, agent_id, feedback.request_id, feedback.outcome.value,
                meta.completion_quality, meta.latency_ms, meta.token_count,
                FeedbackSource.EXPLICIT.value, target)
        except UNREACHABLE as exc:
            raise StoreUnavailableError(f"{type(exc).__name__}: {exc}") from exc
        assert row is not None  # the final SELECT always returns one row
        return Recorded(stored=bool(row["stored"]), previous=row["previous"] or "",
                        known=bool(row["known"]))
