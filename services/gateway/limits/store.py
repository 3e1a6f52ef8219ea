"""The limits' shared state in Postgres (migration 0010): one call of
`intentroute_admit(...)` per request, so every gateway replica checks and updates the
same count in one atomic statement (the agent's state row is locked for the call only).

Why Postgres and not the bus: the gateway already holds a pool to it, the request log
(where tokens and costs come from) is there, and one statement settles the agent's
answered requests and decides on the new one atomically; NATS KV would need a
compare-and-set loop per request and a second source for the costs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import asyncpg

from services.gateway.limits.logic import Admission, Limits, Verdict

# Seconds after its deadline a request without a request-log row stops being waited
# for: it is settled at its estimate (an error answer's rows are written for up to 30 s
# after it, shared.runtime.answers.ERROR_ROWS_GRACE).
SETTLE_GRACE = 60.0

_SQL_ADMIT = """
SELECT verdict, retry_after_ms, spent_day, spent_month, reserved
FROM intentroute_admit($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13::jsonb, $14)
"""


class PgLimits:
    """`LimitStore` on Postgres."""

    def __init__(self, pool: asyncpg.Pool, *, grace: float = SETTLE_GRACE) -> None:
        self._pool = pool
        self._grace = grace

    async def admit(self, agent_id: str, request_id: str, *, accepted_at: float,
                    deadline: float, limits: Limits, prices: Mapping[str, list[float]],
                    now: float) -> Admission:
        row = await self._pool.fetchrow(
            _SQL_ADMIT, agent_id, request_id, accepted_at, deadline, now, limits.rate,
            None if limits.burst is None else float(limits.burst), limits.max_inflight,
            None if limits.tokens_per_min is None else float(limits.tokens_per_min),
            limits.budget_day, limits.budget_month, limits.on_budget == "degrade",
            json.dumps(prices), self._grace)
        assert row is not None  # the function returns one row
        return Admission(verdict=Verdict(row["verdict"]), retry_after_ms=row["retry_after_ms"],
                         spent_day=row["spent_day"], spent_month=row["spent_month"],
                         reserved=row["reserved"])


_SQL_SPENT = """
SELECT coalesce(sum(
    l.tokens_in / 1000.0 * coalesce((p.value ->> 0)::float8, 0)
  + l.tokens_out / 1000.0 * coalesce((p.value ->> 1)::float8, 0)
  + coalesce(l.compute_ms, 0) / 1000.0 * coalesce((p.value ->> 2)::float8, 0)), 0) AS spent,
  count(*) AS requests
FROM request_log l LEFT JOIN jsonb_each($4::jsonb) p ON p.key = l.model
WHERE l.agent_id = $1 AND l.created_at >= $2 AND l.created_at < $3
"""


async def budget_overshoot(conn: asyncpg.Connection, agent_id: str, *, budget: float,
                           prices: Mapping[str, list[float]], since: datetime,
                           until: datetime | None = None) -> dict[str, Any]:
    """How far an agent's spend went past its budget over [since, until), read from the
    request log (every answered request priced with `prices`, `logic.price_table`), not
    from the limits' own counters, so it checks them. `bound` is what was reserved for the
    requests in flight at the agent's last full admission: the overshoot stays within it
    when no request costs more than its estimate (a decaying maximum of the agent's
    recent costs). For `bench fairness`' `budget_overshoot`: call it after the traffic
    has settled, with `since` the UTC day's (or month's) start and the agent's
    `budget_day` (`budget_month`)."""
    until = until or datetime.now(UTC)
    row = await conn.fetchrow(_SQL_SPENT, agent_id, since, until, json.dumps(prices))
    reserved = await conn.fetchval(
        "SELECT reserved FROM agent_limit_state WHERE agent_id = $1", agent_id)
    spent = float(row["spent"]) if row else 0.0
    return {"agent_id": agent_id, "budget": budget, "spent": spent,
            "requests": int(row["requests"]) if row else 0,
            "overshoot": max(0.0, spent - budget), "bound": float(reserved or 0.0)}
