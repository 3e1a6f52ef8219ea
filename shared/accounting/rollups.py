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

`daily_outcomes` counts requests per (day, agent, outcome): `ok`, `clarification` and
each `error:<CODE>`, refusals at admission (RATE_LIMITED, ...) among them.

A refresh replaces the given days' rows (delete + insert in one transaction), so it can
be repeated. Days whose log partitions were already dropped by retention are skipped:
their rollups are all that is left of them. `read_log_rollups` reads what a refresh
would store without storing it, and `pending_days` says which days are not final yet:
the dashboard reads those live.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, NamedTuple

import asyncpg

from shared.policy.agent import AgentPolicy, Price
from shared.store.partitions import default_days, partition_days

# agent id -> model -> price
Prices = Mapping[str, Mapping[str, Price]]

_LOCK_KEY = "intentroute.daily_rollups"

# The request log's rows created in [$1, $2) as rollup rows (daily_rollups' columns but
# updated_at), priced with the agents' prices ($3 .. $7, one array per Price field):
# what a refresh stores, and what the dashboard reads live for days not rolled up yet.
_ROLLUP_ROWS = """
WITH prices AS (
    SELECT * FROM unnest($3::text[], $4::text[], $5::float8[], $6::float8[], $7::float8[])
        AS p(agent_id, model, input_per_1k, output_per_1k, per_compute_s)
), rows AS (
    -- An answer several models wrote (`model_parts`, migration 0016) counts each part's
    -- tokens under its own model; the request itself (and its time) under its row's.
    SELECT r.created_at, r.agent_id, r.query_type, r.layer, r.outcome, r.fallback,
           r.total_ms, r.compute_ms,
           coalesce(p.value ->> 0, r.model) AS model,
           coalesce((p.value ->> 1)::int, r.tokens_in) AS tokens_in,
           coalesce((p.value ->> 2)::int, r.tokens_out) AS tokens_out,
           p.n IS NULL OR p.n = jsonb_array_length(r.model_parts) AS counted
    FROM request_log r
    LEFT JOIN LATERAL jsonb_array_elements(
        CASE WHEN jsonb_typeof(r.model_parts) = 'array' THEN r.model_parts
             ELSE '[]'::jsonb END) WITH ORDINALITY AS p(value, n) ON true
    WHERE r.created_at >= $1 AND r.created_at < $2
), agg AS (
    SELECT (created_at AT TIME ZONE 'UTC')::date AS day, agent_id, model, query_type, layer,
           count(*) FILTER (WHERE counted) AS requests,
           count(*) FILTER (WHERE counted AND outcome LIKE 'error:%') AS errors,
           count(*) FILTER (WHERE counted AND fallback) AS fallbacks,
           sum(tokens_in) AS tokens_in, sum(tokens_out) AS tokens_out,
           coalesce(sum(compute_ms) FILTER (WHERE counted), 0) / 1000.0 AS compute_s,
           {pct} AS pct
    FROM rows
    GROUP BY 1, 2, 3, 4, 5
)
SELECT a.day, a.agent_id, a.model, a.query_type, a.layer, a.requests, a.errors, a.fallbacks,
       a.tokens_in, a.tokens_out, a.compute_s::float8 AS compute_s,
       (a.tokens_in / 1000.0 * coalesce(p.input_per_1k, 0)
        + a.tokens_out / 1000.0 * coalesce(p.output_per_1k, 0)
        + a.compute_s * coalesce(p.per_compute_s, 0))::float8 AS cost,
       a.pct[1] AS latency_p50_ms, a.pct[2] AS latency_p95_ms, a.pct[3] AS latency_p99_ms
FROM agg a LEFT JOIN LATERAL (
    -- The model's price under its `backend/model` name, else its own (set before fleets).
    SELECT * FROM prices p
    WHERE p.agent_id = a.agent_id
      AND p.model IN (a.model, substr(a.model, strpos(a.model, '/') + 1))
    ORDER BY p.model = a.model DESC LIMIT 1) p ON true
"""
ROLLUP_ROWS_SQL = _ROLLUP_ROWS.format(
    pct="percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY total_ms) "
        "FILTER (WHERE counted)")
# Without the groups' percentiles (NULL), for a reader that takes the exact per-agent
# ones instead: a hash aggregate, no sort of the rows. Over a day of 33,000 rows (50
# agents, 300 groups) 28-59 ms instead of 125-150 ms (the sort on five text keys).
ROLLUP_ROWS_NO_PCT_SQL = _ROLLUP_ROWS.format(pct="NULL::float8[]")
_SQL_ROLLUPS = f"""
INSERT INTO daily_rollups
    (day, agent_id, model, query_type, layer, requests, errors, fallbacks, tokens_in,
     tokens_out, compute_s, cost, latency_p50_ms, latency_p95_ms, latency_p99_ms, updated_at)
SELECT r.*, now() FROM ({ROLLUP_ROWS_SQL}) r
"""

# Per (day, agent) over all its requests, in [$1, $2). Grouped on the agent's bytes
# (COLLATE "C": the same groups, equality being byte equality): the sort the
# percentiles need then compares bytes, not the locale's collation (33,000 rows: 32-49
# ms instead of 69-72 ms).
AGENT_LATENCY_ROWS_SQL = """
SELECT day, agent_id, requests, pct[1] AS latency_p50_ms, pct[2] AS latency_p95_ms,
       pct[3] AS latency_p99_ms
FROM (
    SELECT (created_at AT TIME ZONE 'UTC')::date AS day, agent_id COLLATE "C" AS agent_id,
           count(*) AS requests,
           percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY total_ms) AS pct
    FROM request_log
    WHERE created_at >= $1 AND created_at < $2
    GROUP BY 1, 2
) agg
"""
_SQL_AGENT_LATENCY = f"""
INSERT INTO daily_agent_latency
    (day, agent_id, requests, latency_p50_ms, latency_p95_ms, latency_p99_ms, updated_at)
SELECT r.*, now() FROM ({AGENT_LATENCY_ROWS_SQL}) r
"""

# Requests per (day, agent, outcome) in [$1, $2): `ok`, `clarification`, `error:<CODE>`
# (refusals at admission among them); ERROR_ROWS_SQL: the errors only.
OUTCOME_ROWS_SQL = """
SELECT (created_at AT TIME ZONE 'UTC')::date AS day, agent_id, outcome, count(*) AS requests
FROM request_log
WHERE created_at >= $1 AND created_at < $2
GROUP BY 1, 2, 3
"""
ERROR_ROWS_SQL = OUTCOME_ROWS_SQL.replace(
    "AND created_at < $2", "AND created_at < $2 AND outcome LIKE 'error:%'")
_SQL_OUTCOMES = f"""
INSERT INTO daily_outcomes (day, agent_id, outcome, requests, updated_at)
SELECT r.*, now() FROM ({OUTCOME_ROWS_SQL}) r
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
    the log's oldest partition (left as they are), "rollup_rows", "latency_rows",
    "outcome_rows"}."""
    none = {"days": 0, "skipped_days": 0, "rollup_rows": 0, "latency_rows": 0,
            "outcome_rows": 0}
    if until_day < since_day:
        return none
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", _LOCK_KEY)
        floor = await log_floor(conn)
        start = max(since_day, floor) if floor else since_day
        skipped = (start - since_day).days
        if start > until_day:
            return {**none, "skipped_days": skipped}
        low, high = day_start(start), day_start(until_day + timedelta(days=1))
        for table in ("daily_rollups", "daily_agent_latency", "daily_outcomes"):
            await conn.execute(f"DELETE FROM {table} WHERE day >= $1 AND day <= $2",
                               start, until_day)
        rollups = await conn.execute(_SQL_ROLLUPS, low, high, *_price_columns(prices))
        latency = await conn.execute(_SQL_AGENT_LATENCY, low, high)
        outcomes = await conn.execute(_SQL_OUTCOMES, low, high)
    return {"days": (until_day - start).days + 1, "skipped_days": skipped,
            "rollup_rows": _count(rollups), "latency_rows": _count(latency),
            "outcome_rows": _count(outcomes)}


class LogRollups(NamedTuple):
    """Rollup rows computed from the request log without storing them (column names as
    in `daily_rollups`, `daily_agent_latency` and `daily_outcomes`): the rollup rows
    without their percentiles (the per-agent ones are exact), the errors by code."""

    rollups: list[asyncpg.Record]
    latency: list[asyncpg.Record]
    outcomes: list[asyncpg.Record]


async def read_log_rollups(conn: asyncpg.Connection, days: Sequence[date], prices: Prices
                           ) -> LogRollups:
    """What a refresh of `days` would store, read from the request log now (LogRollups
    says what is left out): one set of statements per run of consecutive days (a gap is
    not scanned). Over a day of 33,000 rows, 80-120 ms on the shared 2-core machine."""
    result = LogRollups([], [], [])
    for first, last in day_runs(days):
        low, high = day_start(first), day_start(last + timedelta(days=1))
        result.rollups.extend(await conn.fetch(ROLLUP_ROWS_NO_PCT_SQL, low, high,
                                               *_price_columns(prices)))
        result.latency.extend(await conn.fetch(AGENT_LATENCY_ROWS_SQL, low, high))
        result.outcomes.extend(await conn.fetch(ERROR_ROWS_SQL, low, high))
    return result


def day_runs(days: Sequence[date]) -> list[tuple[date, date]]:
    """Runs of consecutive days, as (first, last)."""
    runs: list[tuple[date, date]] = []
    for day in sorted(set(days)):
        if runs and runs[-1][1] + timedelta(days=1) == day:
            runs[-1] = (runs[-1][0], day)
        else:
            runs.append((day, day))
    return runs


# A day's rollups are final once refreshed this long after the day ended: a request
# admitted before midnight is logged when it ends, by its deadline (REQUEST_DEADLINE,
# 120 s) plus the writer's flush; 15 minutes leave room for a late writer. Until then
# (and for a day never rolled up) the day is read from the log.
FINAL_AFTER = timedelta(minutes=15)

# The window's days [$1, $2] the request log still holds (from its oldest day partition)
# whose rollups are missing or were refreshed before the day was over (+ $3): one index
# probe per day on daily_rollups' primary key (day first); every row of a day carries
# the time of the refresh that wrote it. And the database's clock.
_PENDING_DAYS_SQL = """
WITH floor AS (
    SELECT min(to_date(substring(c.relname from 14), 'YYYYMMDD')) AS day
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'request_log'::regclass AND c.relname ~ '^request_log_p[0-9]{8}$'
)
SELECT statement_timestamp() AS as_of, ARRAY(
    SELECT d::date FROM generate_series($1::date, $2::date, interval '1 day') AS d, floor
    WHERE d::date >= coalesce(floor.day, $1::date)
      AND NOT EXISTS (
          SELECT 1 FROM daily_rollups r
          WHERE r.day = d::date
            AND r.updated_at >= ((d::date + 1)::timestamp AT TIME ZONE 'UTC') + $3::interval)
    ORDER BY 1) AS days
"""


class PendingDays(NamedTuple):
    as_of: datetime  # the database's clock when asked
    days: list[date]  # not final in the rollups: read them from the log


async def pending_days(conn: asyncpg.Connection, since_day: date, until_day: date, *,
                       final_after: timedelta = FINAL_AFTER) -> PendingDays:
    """The days of `since_day` .. `until_day` whose rollups are not final yet (module
    doc of FINAL_AFTER); days before the log's oldest partition never are."""
    row = await conn.fetchrow(_PENDING_DAYS_SQL, since_day, until_day, final_after)
    return PendingDays(as_of=row["as_of"], days=list(row["days"]))


def _count(status: str) -> int:
    return int(status.rsplit(" ", 1)[-1])
