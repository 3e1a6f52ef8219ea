"""The dashboard's reads over a window of UTC days, every one through an index: the
daily rollups (two statements), the feedback (one), the agents' policies for their SLOs
and, where the accounting's `daily_agent_latency` table exists, each agent's exact
daily percentiles. `bench dashboard` reports the scans the planner picks."""

from __future__ import annotations

import asyncio
import datetime as dt

import asyncpg
import msgspec

from shared.policy.agent import AgentPolicy
from shared.store.policies import load_policies

# GROUPING(day, query_type, layer, model): a set bit = that column was aggregated away.
PER_DAY = 0b0111  # (agent_id, day): DAYS_SQL
PER_DAY_TYPE = 0b0011  # (agent_id, day, query_type)
PER_DAY_LAYER = 0b0101  # (agent_id, day, layer)
PER_MODEL = 0b1110  # (agent_id, model) over the window

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
# and by layer, and requests, tokens and cost per model over the window. Two statements
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
                        (agent_id, model))
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


class RollupGroup(msgspec.Struct, frozen=True):
    """One row of `DAYS_SQL` or `BREAKDOWN_SQL`, fields in their column order (built
    positionally: ten times faster than by keyword); the key columns not in `grp`'s
    set are None."""

    agent_id: str
    day: dt.date | None = None
    query_type: str | None = None
    layer: str | None = None
    model: str | None = None
    grp: int = 0
    requests: int = 0
    errors: int = 0
    fallbacks: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    compute_s: float = 0.0
    cost: float = 0.0
    p50_sum: float = 0.0
    p50_n: int = 0
    p95_sum: float = 0.0
    p95_n: int = 0


class FeedbackGroup(msgspec.Struct, frozen=True):
    """One row of `FEEDBACK_SQL`, fields in its column order."""

    agent_id: str
    day: dt.date
    outcome: str
    n: int
    explicit: int = 0
    implicit: int = 0
    quality_sum: float = 0.0
    quality_n: int = 0


# Exact per-agent percentiles of a day (the rollups' finer groups cannot be combined
# exactly), written by the accounting's rollup refresh; read when the table exists.
LATENCY_SQL = """
SELECT agent_id, day, requests, latency_p50_ms, latency_p95_ms
FROM daily_agent_latency
WHERE day >= $1 AND day <= $2
"""
_HAS_LATENCY_SQL = "SELECT to_regclass('daily_agent_latency') IS NOT NULL"


class AgentDayLatency(msgspec.Struct, frozen=True):
    """One row of `LATENCY_SQL`, fields in its column order."""

    agent_id: str
    day: dt.date
    requests: int
    p50_ms: float | None = None
    p95_ms: float | None = None


class Window(msgspec.Struct, frozen=True):
    """UTC days `since`..`until`, both included."""

    since: dt.date
    until: dt.date

    @classmethod
    def ending(cls, until: dt.date, days: int) -> Window:
        return cls(until - dt.timedelta(days=days - 1), until)

    def days(self) -> list[dt.date]:
        count = (self.until - self.since).days + 1
        return [self.since + dt.timedelta(days=i) for i in range(count)]

    def bounds(self) -> tuple[dt.datetime, dt.datetime]:
        start = dt.datetime.combine(self.since, dt.time(), dt.UTC)
        return start, dt.datetime.combine(self.until, dt.time(), dt.UTC) + dt.timedelta(days=1)


class Figures(msgspec.Struct, frozen=True):
    rollups: list[RollupGroup]
    feedback: list[FeedbackGroup]
    policies: dict[str, AgentPolicy]
    latency: list[AgentDayLatency] = []


class FiguresUnavailableError(RuntimeError):
    """The database could not answer (down, or the queries ran past their timeout)."""


async def read_figures(pool: asyncpg.Pool, window: Window, *,
                       timeout_ms: int = 10_000) -> Figures:
    """The window's rollups on one connection and, concurrently, its feedback, the
    policies and the exact daily latencies on another; each in a read-only transaction
    bounded by `timeout_ms`."""

    async def rollups() -> list[RollupGroup]:
        async with pool.acquire() as conn, conn.transaction(readonly=True):
            # Enough memory to hash every grouping set at once instead of sorting on disk.
            await conn.execute(f"SET LOCAL work_mem = '64MB';"
                               f" SET LOCAL statement_timeout = {int(timeout_ms)}")
            days = await conn.fetch(DAYS_SQL, window.since, window.until)
            breakdown = await conn.fetch(BREAKDOWN_SQL, window.since, window.until)
        return [RollupGroup(*row) for rows in (days, breakdown) for row in rows]

    async def the_rest() -> Figures:
        start, end = window.bounds()
        async with pool.acquire() as conn, conn.transaction(readonly=True):
            await conn.execute(f"SET LOCAL statement_timeout = {int(timeout_ms)}")
            rows = await conn.fetch(FEEDBACK_SQL, window.since, window.until, start, end)
            policies = await load_policies(conn)
            latency = []
            if await conn.fetchval(_HAS_LATENCY_SQL):
                latency = [AgentDayLatency(*row) for row in
                           await conn.fetch(LATENCY_SQL, window.since, window.until)]
        return Figures([], [FeedbackGroup(*row) for row in rows], policies, latency)

    try:
        groups, rest = await asyncio.gather(rollups(), the_rest())
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
        raise FiguresUnavailableError(f"{type(exc).__name__}: {exc}") from exc
    return msgspec.structs.replace(rest, rollups=groups)
