"""Retention: the request log's hot window and the rollups' year.

One maintenance pass (the learning job calls it; `intentroute retention` runs it by
hand):

1. partitions for today and the next `ahead_days` days, and for any day whose rows
   wait in the DEFAULT partition (moved into it);
2. the days about to leave the hot window are rolled up one last time, so no day is
   dropped before its rollups are final;
3. day partitions older than `hot_days` are dropped (DROP TABLE, not DELETE: instant,
   no bloat, no vacuum): a day D goes once D + 1 <= now - hot_days, so every row is
   kept at least `hot_days` * 24 h;
4. rollup rows older than `rollup_days` are deleted (they are few: per day, agent,
   model, type and layer; per day and agent; per day, agent and outcome).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from shared.accounting.rollups import Prices, prices_of, refresh_rollups
from shared.store.partitions import (
    PartitionsBusyError,
    days_ahead,
    drop_partitions_before,
    ensure_partitions,
    partition_days,
)
from shared.store.policies import load_policies

log = logging.getLogger("intentroute.accounting")

HOT_DAYS = 30
ROLLUP_DAYS = 365
AHEAD_DAYS = 7


async def apply_retention(conn: asyncpg.Connection, now: datetime, hot_days: int = HOT_DAYS,
                          rollup_days: int = ROLLUP_DAYS, *, prices: Prices | None = None,
                          ahead_days: int = AHEAD_DAYS) -> dict[str, Any]:
    """One maintenance pass at `now` (see the module doc). `prices` (agent -> model ->
    Price) defaults to the agents' stored policies. Returns what it did, as counts."""
    if hot_days < 1 or rollup_days < 1:
        raise ValueError("hot_days and rollup_days must be >= 1")
    today = now.astimezone(UTC).date()
    made = await ensure_partitions(conn, days_ahead(today, ahead_days))
    hot_cutoff = (now - timedelta(days=hot_days)).astimezone(UTC).date()
    leaving = [day for day in await partition_days(conn) if day < hot_cutoff]
    rolled = 0
    if leaving:
        if prices is None:
            prices = prices_of(await load_policies(conn))
        rolled = (await refresh_rollups(conn, leaving[0], hot_cutoff - timedelta(days=1),
                                        prices))["days"]
    try:
        dropped, default_deleted = await drop_partitions_before(conn, hot_cutoff)
        busy = False
    except PartitionsBusyError as exc:
        log.warning("retention: %s; the next pass drops them", exc)
        dropped, default_deleted, busy = [], 0, True
    rollup_cutoff = today - timedelta(days=rollup_days)
    async with conn.transaction():
        rollups = await conn.execute("DELETE FROM daily_rollups WHERE day < $1", rollup_cutoff)
        latency = await conn.execute("DELETE FROM daily_agent_latency WHERE day < $1",
                                     rollup_cutoff)
        outcomes = await conn.execute("DELETE FROM daily_outcomes WHERE day < $1",
                                      rollup_cutoff)
    return {
        "partitions_created": made["created"],
        "rows_moved_from_default": made["moved_from_default"],
        "days_rolled_up_before_drop": rolled,
        "partitions_dropped": len(dropped),
        # True when the log stayed locked too long: nothing dropped this time.
        "drop_deferred": busy,
        "default_rows_deleted": default_deleted,
        "rollup_rows_deleted": _count(rollups),
        "latency_rows_deleted": _count(latency),
        "outcome_rows_deleted": _count(outcomes),
        "hot_from": hot_cutoff.isoformat(),
        "rollups_from": rollup_cutoff.isoformat(),
    }


def _count(status: str) -> int:
    return int(status.rsplit(" ", 1)[-1])
