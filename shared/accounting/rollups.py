"""Daily rollups (UTC days) of the request log, recomputed from it.

`daily_rollups` has one row per (day, agent, model, query_type, layer): requests,
errors (outcome `error:*`), fallbacks, tokens in / out, compute seconds, cost and the
p50/p95/p99 of total_ms (percentile_cont: interpolated; rows without a total_ms, i.e.
error answers and clarifications, are not in the percentiles). `daily_agent_latency`
has the same percentiles over each agent's whole day, since percentiles of the finer
groups cannot be combined.

Cost of a group = tokens_in / 1000 * input_per_1k + tokens_out / 1000 * output_per_1k
+ compute_s * per_compute_s, with the agent's price for that model (`intentroute agent
set NAME price.MODEL=IN,OUT[,COMPUTE_S]`); a model without a price costs 0. It is the
per-request sum, computed on the group's sums (the formula is linear).

A refresh replaces the given days' rows (delete + insert in one transaction), so it can
be repeated. Days whose log partitions were already dropped by retention are skipped:
their rollups are all that is left of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import asyncpg

from shared.policy.agent import AgentPolicy, Price
from shared.store.partitions import default_days, partition_days

# agent id -> model -> price
Prices = Mapping[str, Mapping[str, Price]]

_LOCK_KEY = "intentroute.daily_rollups"

_SQL_ROLLUPS = """
INSERT INTO daily_rollups
    (day, agent_id, model, query_type, layer, requests, errors, fallbacks, tokens_in,
     tokens_out, compute_s, cost, latency_p50_ms, latency_p95_ms, latency_p99_ms, updated_at)
WITH prices AS (
    SELECT * FROM unnest($3::text[], $4::text[], $5::float8[], $6::float8[], $7::float8[])
        AS p(agent_id, model, input_per_1k, output_per_1k, per_compute_s)
), agg AS (
    SELECT (created_at AT TIME ZONE 'UTC')::date AS day, agent_id, model, query_type, layer,
           count(*) AS requests,
           count(*) FILTER (WHERE outcome LIKE 'error:%') AS errors,
           count(*) FILTER (WHERE fallback) AS fallbacks,
           sum(tokens_in) AS tokens_in, sum(tokens_out) AS tokens_out,
           coalesce(sum(compute_ms), 0) / 1000.0 AS compute_s,
           percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY total_ms) AS pct
    FROM request_log
    WHERE created_at >= $1 AND created_at < $2
    GROUP BY 1, 2, 3, 4, 5
)
SELECT a.day, a.agent_id, a.model, a.query_type, a.layer, a.requests, a.errors, a.fallbacks,
       a.tokens_in, a.tokens_out, a.compute_s,
       a.tokens_in / 1000.0 * coalesce(p.input_per_1k, 0)
         + a.tokens_out / 1000.0 * coalesce(p.output_per_1k, 0)
         + a.compute_s * coalesce(p.per_compute_s, 0),
       a.pct[1], a.pct[2], a.pct[3], now()
FROM agg a LEFT JOIN prices p ON p.agent_id = a.agent_id AND p.model = a.model
"""

_SQL_AGENT_LATENCY = """
INSERT INTO daily_agent_latency
    (day, agent_id, requests, latency_p50_ms, latency_p95_ms, latency_p99_ms, updated_at)
SELECT day, agent_id, requests, pct[1], pct[2], pct[3], now()
FROM (
    SELECT (created_at AT TIME ZONE 'UTC')::date AS day, agent_id, count(*) AS requests,
           percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY total_ms) AS pct
    FROM request_log
    WHERE created_at >= $1 AND created_at < $2
    GROUP BY 1, 2
) agg
"""


def prices_of(policies: Mapping[str, AgentPolicy]) -> dict[str, dict[str, Price]]:
    return {agent: dict(policy.prices) for agent, policy in policies.items() if policy.prices}


def _price_columns(prices: Prices) -> list[list[Any]]:
    rows = [(agent, model, p.input_per_1k, p.output_per_1k, p.per_compute_s)
            for agent, table in prices.items() for model, p in table.items()]
    return [list(col) for col in zip(*rows, strict=True)] if rows else [[], [], [], [], []]


def day_start(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


async def log_floor(conn: asyncpg.Connection) -> date | None:
    """The oldest day the request log can still hold (its oldest partition, or an older
    row waiting in the DEFAULT partition); None when it has no day partition."""
    days = await partition_days(conn)
    if not days:
        return None
    waiting = await default_days(conn)
    return min(days[0], waiting[0]) if waiting else days[0]


async def refresh_rollups(conn: asyncpg.Connection, since_day: date, until_day: date,
                          prices: Prices) -> dict[str, Any]:
    """Recompute the rollups of the UTC days `since_day` .. `until_day` (both included)
    from the request log. Returns {"days": days refreshed, "skipped_days": days before
    the log's oldest partition (left as they are), "rollup_rows", "latency_rows"}."""
    if until_day < since_day:
        return {"days": 0, "skipped_days": 0, "rollup_rows": 0, "latency_rows": 0}
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", _LOCK_KEY)
        floor = await log_floor(conn)
        start = max(since_day, floor) if floor else since_day
        skipped = (start - since_day).days
        if start > until_day:
            return {"days": 0, "skipped_days": skipped, "rollup_rows": 0, "latency_rows": 0}
        low, high = day_start(start), day_start(until_day + timedelta(days=1))
        await conn.execute("DELETE FROM daily_rollups WHERE day >= $1 AND day <= $2",
                           start, until_day)
        await conn.execute("DELETE FROM daily_agent_latency WHERE day >= $1 AND day <= $2",
                           start, until_day)
        rollups = await conn.execute(_SQL_ROLLUPS, low, high, *_price_columns(prices))
        latency = await conn.execute(_SQL_AGENT_LATENCY, low, high)
    return {"days": (until_day - start).days + 1, "skipped_days": skipped,
            "rollup_rows": _count(rollups), "latency_rows": _count(latency)}


def _count(status: str) -> int:
    return int(status.rsplit(" ", 1)[-1])
