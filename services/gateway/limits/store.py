"""The limits' shared state in Postgres (migrations 0010, 0012): one call of
`intentroute_lease(...)` records what a gateway replica admitted on its allowance,
settles the agent's answered requests, decides the requests asked about and grants the
replica its next allowance, in one atomic statement (the agent's state row is locked
for the call only), so every replica checks and updates the same count.

Why Postgres and not the bus: the gateway already holds a pool to it, the request log
(where tokens and costs come from) is there, and one statement settles the agent's
answered requests and decides on the new ones atomically; NATS KV would need a
compare-and-set loop per request and a second source for the costs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg

from services.gateway.limits.ports import Admission, Ask, Grant, Held, Limits, Verdict

# Seconds after its deadline a request without a request-log row stops being waited
# for: it is settled at its estimate (an error answer's rows are written for up to 30 s
# after it, shared.runtime.endings.ERROR_ROWS_GRACE).
SETTLE_GRACE = 60.0

_SQL_LEASE = """
SELECT verdict, retry_after_ms, spent_day, spent_month, reserved, extra, estimate
FROM intentroute_lease($1, $2, $3, $4, $5::text[], $6::float8[], $7::float8[], $8::text[],
                       $9::float8[], $10::float8[], $11::float8[], $12, $13, $14, $15, $16,
                       $17, $18, $19, $20, $21, $22, $23::jsonb, $24)
"""


class PgLimits:
    """`LimitStore` on Postgres."""

    def __init__(self, pool: asyncpg.Pool, *, grace: float = SETTLE_GRACE) -> None:
        self._pool = pool
        self._grace = grace

    async def admit(self, agent_id: str, request_id: str, *, accepted_at: float,
                    deadline: float, limits: Limits, prices: Mapping[str, list[float]],
                    now: float) -> Admission:
        """One request decided on its own, no allowance asked for (the per-request
        check every allowance is measured against)."""
        grant = await self.lease(
            agent_id, replica="", seq=0, asks=[Ask(request_id, accepted_at, deadline)],
            held=[], keep=0, want=0, ttl=0.0, share=1, limits=limits, prices=prices, now=now)
        return grant.admissions[0]

    async def lease(self, agent_id: str, *, replica: str, seq: int, asks: Sequence[Ask],
                    held: Sequence[Held], keep: int, want: int, ttl: float, share: int,
                    limits: Limits, prices: Mapping[str, list[float]], now: float) -> Grant:
        rows = await self._pool.fetch(
            _SQL_LEASE, agent_id, replica, seq, now,
            [a.request_id for a in asks], [a.accepted_at for a in asks],
            [a.deadline for a in asks], [h.request_id for h in held],
            [h.accepted_at for h in held], [h.deadline for h in held],
            [h.estimate for h in held], keep, want, ttl, share, limits.rate,
            None if limits.burst is None else float(limits.burst), limits.max_inflight,
            None if limits.tokens_per_min is None else float(limits.tokens_per_min),
            limits.budget_day, limits.budget_month, limits.on_budget == "degrade",
            json.dumps(prices), self._grace)
        admissions = [
            Admission(verdict=Verdict(row["verdict"]), retry_after_ms=row["retry_after_ms"],
                      spent_day=row["spent_day"], spent_month=row["spent_month"],
                      reserved=row["reserved"])
            for row in rows if row["verdict"] is not None]
        return Grant(admissions=admissions, extra=rows[0]["extra"],
                     estimate=rows[0]["estimate"])


_SQL_SPENT = """
SELECT coalesce(sum(
    l.tokens_in / 1000.0 * coalesce((p.value ->> 0)::float8, 0)
  + l.tokens_out / 1000.0 * coalesce((p.value ->> 1)::float8, 0)
  + coalesce(l.compute_ms, 0) / 1000.0 * coalesce((p.value ->> 2)::float8, 0)
  + intentroute_parts_cost($4::jsonb, l.model_parts)), 0) AS spent,
  count(*) AS requests
FROM request_log l LEFT JOIN LATERAL (
    SELECT intentroute_price($4::jsonb, l.model) AS value) p ON true
WHERE l.agent_id = $1 AND l.created_at >= $2 AND l.created_at < $3
"""


async def budget_overshoot(conn: asyncpg.Connection, agent_id: str, *, budget: float,
                           prices: Mapping[str, list[float]], since: datetime,
                           until: datetime | None = None) -> dict[str, Any]:
    """How far an agent's spend went past its budget over [since, until), read from the
    request log (every answered request priced with `prices`, `logic.price_table`), not
    from the limits' own counters, so it checks them. `bound` is what was reserved at the
    agent's last admission or allowance (the estimates of its requests in flight and of
    the admissions leased to replicas): the overshoot stays within it when no request
    costs more than its estimate (a decaying maximum of the agent's recent costs). For
    `bench fairness`' `budget_overshoot`: call it after the traffic has settled, with
    `since` the UTC day's (or month's) start and the agent's `budget_day`
    (`budget_month`)."""
    until = until or datetime.now(UTC)
    row = await conn.fetchrow(_SQL_SPENT, agent_id, since, until, json.dumps(prices))
    reserved = await conn.fetchval(
        "SELECT reserved FROM agent_limit_state WHERE agent_id = $1", agent_id)
    spent = float(row["spent"]) if row else 0.0
    return {"agent_id": agent_id, "budget": budget, "spent": spent,
            "requests": int(row["requests"]) if row else 0,
            "overshoot": max(0.0, spent - budget), "bound": float(reserved or 0.0)}
