"""Accounting benchmark: rollups, reports and retention over a request log of N rows.

An embedded Postgres (as `intentroute up` runs it) gets `rows` request-log rows spread
evenly over `days` UTC days ending today, for `agents` agents with four models, four
query types and four layers, every agent priced; then it times:

* `rollups_all_days_s`: `refresh_rollups` over every day (the worst case of the
  learning job: the whole hot window recomputed);
* `rollups_one_day_s`: one day;
* `job_pass_s`: the learning job's accounting phase in the steady state (yesterday and
  today refreshed, a retention pass with nothing to drop);
* `report_costs_ms`, `report_slo_ms`: the reports read from the rollups;
* `retention_s`: `apply_retention` dropping the two oldest days (after their last
  rollup) and creating the days ahead.

Seeding is timed apart (`seed_s`): it is not part of any job.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from shared.accounting.costs import cost_report
from shared.accounting.phase import accounting_pass
from shared.accounting.retention import apply_retention
from shared.accounting.rollups import refresh_rollups
from shared.accounting.slo import slo_report
from shared.policy.agent import AgentPolicy, Price
from shared.store import asyncpg_dsn
from shared.store.partitions import ensure_partitions

MODELS = ("big", "small", "extractive", "")
TYPES = ("RETRIEVAL", "CODE_GENERATION", "CONVERSATIONAL", "PLATFORM")
LAYERS = ("rules", "embedding", "llm", "declared")

# One statement: row n belongs to agent n % agents, day (n / agents) % days, and cycles
# models, types and layers with other strides, so most combinations occur.
_SQL_SEED = """
INSERT INTO request_log
    (agent_id, request_id, session_id, created_at, query_type, layer, model, model_slot,
     tokens_in, tokens_out, compute_ms, total_ms, outcome, fallback, stage_ms)
SELECT 'agent-' || (n % $2), 'r' || n, 's' || (n % 997),
       $3::timestamptz - (((n / $2) % $4) || ' days')::interval
           - ((n % 86399) || ' seconds')::interval,
       ($5::text[])[1 + (n / 13) % 4], ($6::text[])[1 + (n / 7) % 4],
       ($7::text[])[1 + (n / 3) % 4],
       'main', 50 + n % 1500, 10 + n % 600,
       CASE WHEN n % 4 = 1 THEN 100 + n % 4000 END,
       5 + (n % 1000) * 0.9, CASE WHEN n % 50 = 0 THEN 'error:X' ELSE 'ok' END,
       n % 20 = 0, '{}'::jsonb
FROM generate_series(0, $1 - 1) AS n
"""


def _policies(agents: int) -> dict[str, AgentPolicy]:
    prices = {"big": Price(0.5, 1.5), "small": Price(0.05, 0.1, 0.002)}
    return {f"agent-{i}": AgentPolicy(prices=prices, slo_p95_ms=800.0) for i in range(agents)}


async def _measure(db_url: str, rows: int, agents: int, days: int) -> dict[str, Any]:
    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        now = datetime.now(UTC)
        today = now.date()
        first = today - timedelta(days=days - 1)
        await ensure_partitions(conn, [first + timedelta(days=n) for n in range(days)])
        t = time.perf_counter()
        await conn.execute(_SQL_SEED, rows, agents, now.replace(hour=23, minute=59, second=59),
                           days, list(TYPES), list(LAYERS), list(MODELS))
        await conn.execute("ANALYZE request_log")
        seed_s = time.perf_counter() - t
        policies = _policies(agents)
        prices = {agent: dict(p.prices) for agent, p in policies.items()}

        t = time.perf_counter()
        full = await refresh_rollups(conn, first, today, prices)
        all_days_s = time.perf_counter() - t
        t = time.perf_counter()
        await refresh_rollups(conn, today, today, prices)
        one_day_s = time.perf_counter() - t
        t = time.perf_counter()
        await accounting_pass(conn, now, prices=prices)
        job_pass_s = time.perf_counter() - t
        t = time.perf_counter()
        costs = await cost_report(conn, first, today, prices=prices, main_model="big")
        costs_ms = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
        await slo_report(conn, first, today, policies=policies)
        slo_ms = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
        kept = await apply_retention(conn, now, hot_days=days - 3, rollup_days=365,
                                     prices=prices)
        retention_s = time.perf_counter() - t
        logged = costs.totals.requests
    finally:
        await conn.close()
    return {
        "rows": rows, "agents": agents, "days": days,
        "seed_s": round(seed_s, 2),
        "rollups_all_days_s": round(all_days_s, 3),
        "rollups_one_day_s": round(one_day_s, 3),
        "rollup_rows": full["rollup_rows"],
        "job_pass_s": round(job_pass_s, 3),
        "report_costs_ms": round(costs_ms, 1),
        "report_slo_ms": round(slo_ms, 1),
        "retention_s": round(retention_s, 3),
        "partitions_dropped": kept["partitions_dropped"],
        "requests_in_report": logged,
    }


def run(rows: int = 1_000_000, agents: int = 50, days: int = 30) -> dict[str, Any]:
    from intentroute.stack import PostgresServer
    from shared.store import migrate

    with tempfile.TemporaryDirectory(prefix="ir-bench-acct-") as tmp:
        pg = PostgresServer(Path(tmp) / "postgres").start()
        try:
            migrate(pg.url)
            return asyncio.run(_measure(pg.url, rows, agents, days))
        finally:
            pg.stop()


if __name__ == "__main__":
    print(json.dumps(run()))
