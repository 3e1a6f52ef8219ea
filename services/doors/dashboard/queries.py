"""The dashboard's reads over a window of UTC days, every one through an index: the
daily rollups (two statements), refusals and errors by code (`daily_outcomes`), the
feedback (one), the agents' policies (SLOs, currencies, prices), the agents' scores and
their divergence, and, where the accounting's `daily_agent_latency` table exists, each
agent's exact daily percentiles. `bench dashboard` reports the scans the planner picks.

Days whose rollups are not final (today; a day the learning job has not rolled up since
it ended; every day while it never runs, as under `intentroute up`) are also read from
the request log, as a refresh would compute them (`shared.accounting.rollups`), and an
agent's day the log has rows for is shown from them (live.py): the figures are as fresh
as the log, and `as_of` says when they were read."""

from __future__ import annotations

import asyncio
import datetime as dt

import asyncpg
import msgspec

from services.doors.dashboard.live import LiveFigures, live_figures, overlay
from services.doors.dashboard.rows import (
    PER_DAY,
    AgentDayLatency,
    FeedbackGroup,
    OutcomeGroup,
    RollupGroup,
    ScoreRow,
    Window,
)
from shared.accounting.rollups import pending_days, prices_of, read_log_rollups
from shared.contracts.errors import RetryableError
from shared.contracts.response import ErrorCode
from shared.policy.agent import AgentPolicy
from shared.store.policies import load_policies

# Rollups in two statements over the same rows (the window's days, through an index
# that has `day`), both in `RollupGroup`'s column order. Per agent and day, every
# sum; percentiles do not add up, so a day gets the request-weighted mean of its rows'
# percentiles (sum of p * requests and the requests that carried a p).
DAYS_SQL = f"""
SELECT agent_id, day, NULL::text AS query_type, NULL::text AS layer, NULL::text AS model,
       {PER_DAY} AS grp,
       sum(requests)::bigint AS requests,
       sum(errors)::bigint AS errors,
       sum(fallbacks)::bigint AS fallbacks,
       sum(tokens_in)::bigint AS tokens_in,
       sum(tokens_out)::bigint AS tokens_out,
       sum(compute_s)::float8 AS compute_s,
       sum(cost)::float8 AS cost,
       coalesce(sum(latency_p50_ms * requests)
                FILTER (WHERE latency_p50_ms IS NOT NULL), 0)::float8 AS p50_sum,
       coalesce(sum(requests) FILTER (WHERE latency_p50_ms IS NOT NULL), 0)::bigint AS p50_n,
       coalesce(sum(latency_p95_ms * requests)
                FILTER (WHERE latency_p95_ms IS NOT NULL), 0)::float8 AS p95_sum,
       coalesce(sum(requests) FILTER (WHERE latency_p95_ms IS NOT NULL), 0)::bigint AS p95_n
FROM daily_rollups
WHERE day >= $1 AND day <= $2
GROUP BY agent_id, day
"""
# The breakdowns need fewer sums (the rest are zeros): requests per day by query type
# and by layer, and requests, tokens and cost per day and model. Two statements
# because one set of four groupings computes every sum four times (~2x slower).
BREAKDOWN_SQL = """
SELECT agent_id, day, query_type, layer, model,
       GROUPING(day, query_type, layer, model) AS grp,
       sum(requests)::bigint AS requests, 0::bigint AS errors, 0::bigint AS fallbacks,
       sum(tokens_in)::bigint AS tokens_in, sum(tokens_out)::bigint AS tokens_out,
       0::float8 AS compute_s, sum(cost)::float8 AS cost, 0::float8 AS p50_sum,
       0::bigint AS p50_n, 0::float8 AS p95_sum, 0::bigint AS p95_n
FROM daily_rollups
WHERE day >= $1 AND day <= $2
GROUP BY GROUPING SETS ((agent_id, day, query_type), (agent_id, day, layer),
                        (agent_id, day, model))
"""

# Feedback is counted on the UTC day it was last set. The agent list lets the planner
# walk ix_feedback_agent_updated (agent_id, updated_at) one agent at a time instead of
# reading the whole table, which keeps every verdict ever given.
FEEDBACK_SQL = """
SELECT agent_id, (updated_at AT TIME ZONE 'UTC')::date AS day, outcome,
       count(*)::bigint AS n,
       count(*) FILTER (WHERE source = 'explicit')::bigint AS explicit,
       count(*) FILTER (WHERE source = 'implicit')::bigint AS implicit,
       coalesce(sum(completion_quality), 0)::float8 AS quality_sum,
       count(completion_quality)::bigint AS quality_n
FROM feedback
WHERE agent_id = ANY(ARRAY(
        SELECT agent_id FROM agents
        UNION SELECT DISTINCT agent_id FROM daily_rollups WHERE day >= $1 AND day <= $2))
  AND updated_at >= $3 AND updated_at < $4
GROUP BY 1, 2, 3
"""


# Exact per-agent percentiles of a day (the rollups' finer groups cannot be combined
# exactly), written by the accounting's rollup refresh; read when the table exists.
LATENCY_SQL = """
SELECT agent_id, day, requests, latency_p50_ms, latency_p95_ms
FROM daily_agent_latency
WHERE day >= $1 AND day <= $2
"""
# Errors by code per agent and day (refusals at admission among them).
OUTCOMES_SQL = """
SELECT agent_id, day, outcome, sum(requests)::bigint AS requests
FROM daily_outcomes
WHERE day >= $1 AND day <= $2 AND outcome LIKE 'error:%'
GROUP BY 1, 2, 3
"""
# Each agent's scores next to the global rate of the same (model, query type), as the
# gateway's score refresh left them (every SCORE_FULL_REFRESH, and after feedback).
SCORES_SQL = """
SELECT s.agent_id, s.model, s.query_type, s.trials, s.score, g.score AS global_score,
       s.divergence, s.diverged, s.updated_at
FROM agent_scores s
LEFT JOIN agent_scores g
       ON g.agent_id = '*' AND g.model = s.model AND g.query_type = s.query_type
WHERE s.agent_id <> '*'
"""
_HAS_LATENCY_SQL = "SELECT to_regclass('daily_agent_latency') IS NOT NULL"


class Figures(msgspec.Struct, frozen=True):
    rollups: list[RollupGroup]
    feedback: list[FeedbackGroup]
    policies: dict[str, AgentPolicy]
    latency: list[AgentDayLatency] = []
    outcomes: list[OutcomeGroup] = []
    scores: list[ScoreRow] = []
    # When the database was asked, and the days read from the request log.
    as_of: dt.datetime | None = None
    live_days: list[dt.date] = []


class FiguresUnavailableError(RetryableError):
    """The database could not answer (down, or the queries ran past their timeout)."""

    code = ErrorCode.STORE_UNAVAILABLE


async def _bounded(conn: asyncpg.Connection, timeout_ms: int, work_mem: str = "") -> None:
    memory = f"SET LOCAL work_mem = '{work_mem}'; " if work_mem else ""
    await conn.execute(f"{memory}SET LOCAL statement_timeout = {int(timeout_ms)}")


async def read_figures(pool: asyncpg.Pool, window: Window, *,
                       timeout_ms: int = 10_000) -> Figures:
    """First which days are read from the log, and the policies; then the window's
    rollups and outcomes on one connection and, concurrently, its feedback, exact daily
    latencies, scores and the log's figures of the days not final on another; each step
    in a read-only transaction bounded by `timeout_ms`."""

    async def rollups() -> tuple[list[RollupGroup], list[OutcomeGroup]]:
        async with pool.acquire() as conn, conn.transaction(readonly=True):
            # Enough memory to hash every grouping set at once instead of sorting on disk.
            await _bounded(conn, timeout_ms, "64MB")
            days = await conn.fetch(DAYS_SQL, window.since, window.until)
            breakdown = await conn.fetch(BREAKDOWN_SQL, window.since, window.until)
            outcomes = await conn.fetch(OUTCOMES_SQL, window.since, window.until)
        return ([RollupGroup(*row) for rows in (days, breakdown) for row in rows],
                [OutcomeGroup(*row) for row in outcomes])

    async def the_rest(live: list[dt.date], policies: dict[str, AgentPolicy]
                       ) -> tuple[Figures, LiveFigures]:
        start, end = window.bounds()
        async with pool.acquire() as conn, conn.transaction(readonly=True):
            await _bounded(conn, timeout_ms)
            rows = await conn.fetch(FEEDBACK_SQL, window.since, window.until, start, end)
            latency = []
            if await conn.fetchval(_HAS_LATENCY_SQL):
                latency = [AgentDayLatency(*row) for row in
                           await conn.fetch(LATENCY_SQL, window.since, window.until)]
            scores = [ScoreRow(*row) for row in await conn.fetch(SCORES_SQL)]
            log = await read_log_rollups(conn, live, prices_of(policies))
        return (Figures([], [FeedbackGroup(*row) for row in rows], policies, latency,
                        scores=scores), live_figures(log))

    try:
        async with pool.acquire() as conn, conn.transaction(readonly=True):
            await _bounded(conn, timeout_ms)
            pending = await pending_days(conn, window.since, window.until)
            policies = await load_policies(conn)
        (groups, outcomes), (rest, live) = await asyncio.gather(
            rollups(), the_rest(pending.days, policies))
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
        raise FiguresUnavailableError(f"{type(exc).__name__}: {exc}") from exc
    shown = overlay(LiveFigures(groups, rest.latency, outcomes), live)
    return msgspec.structs.replace(rest, rollups=shown.rollups, latency=shown.latency,
                                   outcomes=shown.outcomes, as_of=pending.as_of,
                                   live_days=pending.days)
