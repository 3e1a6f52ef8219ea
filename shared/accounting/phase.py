"""The learning job's accounting phase (ADR-0006 phase 1: global aggregates): the rollups
of the days that may have changed, then a retention pass.

The learning job runs it first (`shared.learning.job.default_phases`); a phase is
`async (db, clock) -> figures`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any

import asyncpg

from shared.accounting.retention import HOT_DAYS, ROLLUP_DAYS, apply_retention
from shared.accounting.rollups import Prices, prices_of, refresh_rollups
from shared.store.policies import load_policies

Clock = Callable[[], datetime]
PhaseFn = Callable[[asyncpg.Connection, Clock], Awaitable[dict[str, Any]]]


async def first_stale_day(conn: asyncpg.Connection, today: date, hot_days: int) -> date:
    """Yesterday (a request admitted before midnight may be written after it), or the
    last day already rolled up if that is older (the job was down), but not before
    the hot window."""
    last: date | None = await conn.fetchval("SELECT max(day) FROM daily_rollups")
    oldest = today - timedelta(days=hot_days)
    since = today - timedelta(days=1)
    if last is None:
        return oldest
    return max(oldest, min(since, last))


async def accounting_pass(conn: asyncpg.Connection, now: datetime, *,
                          hot_days: int = HOT_DAYS, rollup_days: int = ROLLUP_DAYS,
                          prices: Prices | None = None) -> dict[str, Any]:
    """Refresh the stale days' rollups with the agents' current prices, then retention
    (partitions ahead, expired partitions dropped, old rollups deleted)."""
    if prices is None:
        prices = prices_of(await load_policies(conn))
    today = now.astimezone(UTC).date()
    since = await first_stale_day(conn, today, hot_days)
    rollups = await refresh_rollups(conn, since, today, prices)
    retention = await apply_retention(conn, now, hot_days, rollup_days, prices=prices)
    return {"refreshed_from": since.isoformat(), **rollups, **retention}


def accounting_phase(hot_days: int = HOT_DAYS, rollup_days: int = ROLLUP_DAYS) -> PhaseFn:
    async def run(conn: asyncpg.Connection, clock: Clock) -> dict[str, Any]:
        return await accounting_pass(conn, clock(), hot_days=hot_days, rollup_days=rollup_days)

    return run
