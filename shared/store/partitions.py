"""The request log's day partitions (UTC): which exist, creating them ahead, dropping them.

`request_log` is `PARTITION BY RANGE (created_at)`: one partition per UTC day named
`request_log_pYYYYMMDD`, plus `request_log_default` (DEFAULT). Partitions are created
ahead (today and the next days) by the migration and by every maintenance run
(`apply_retention`, called by the learning job and `intentroute retention`); a write
for a day without a partition never fails, it lands in the DEFAULT partition, and the
next maintenance run creates that day's partition and moves the rows into it. Postgres
refuses to create a partition whose range holds rows of the DEFAULT partition, so a
new partition is built detached, filled with those rows and then attached (attaching
also takes a weaker lock on the parent than CREATE ... PARTITION OF, so concurrent
writes wait less).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import date, timedelta

import asyncpg

TABLE = "request_log"
DEFAULT_PARTITION = f"{TABLE}_default"
_NAME = re.compile(rf"^{TABLE}_p(\d{{8}})$")
# Serialises partition maintenance between processes (every worker may run the job).
_LOCK_KEY = "intentroute.request_log.partitions"


def is_partition(table: str) -> bool:
    """A partition of the request log (a day's or the DEFAULT one)."""
    return table == DEFAULT_PARTITION or _NAME.match(table) is not None


def partition_name(day: date) -> str:
    return f"{TABLE}_p{day:%Y%m%d}"


def day_of(name: str) -> date | None:
    """The day of a partition this module names, None for any other table."""
    match = _NAME.match(name)
    if not match:
        return None
    raw = match.group(1)
    return date(int(raw[:4]), int(raw[4:6]), int(raw[6:]))


def bounds(day: date) -> tuple[str, str]:
    """The partition's range as UTC timestamp literals (the session's time zone must not
    move a day's boundaries)."""
    return f"{day.isoformat()} 00:00:00+00", f"{(day + timedelta(days=1)).isoformat()} 00:00:00+00"


async def lock(conn: asyncpg.Connection) -> None:
    """Transaction-scoped lock over partition maintenance (call inside a transaction)."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", _LOCK_KEY)


async def partition_days(conn: asyncpg.Connection) -> list[date]:
    """The days that have a partition, oldest first."""
    names = await conn.fetch(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = $1::regclass", TABLE)
    return sorted(d for d in (day_of(r["relname"]) for r in names) if d is not None)


async def default_days(conn: asyncpg.Connection) -> list[date]:
    """The days of the rows waiting in the DEFAULT partition."""
    rows = await conn.fetch(
        f"SELECT DISTINCT (created_at AT TIME ZONE 'UTC')::date AS day FROM {DEFAULT_PARTITION}")
    return sorted(r["day"] for r in rows)


async def _create(conn: asyncpg.Connection, day: date) -> int:
    """Create and attach `day`'s partition, moving its rows out of the DEFAULT partition;
    returns how many moved. The DDL runs in `request_log_create_partition` (migration
    0009), as the schema's owner: the learning job's role may call it but creates and
    drops nothing itself."""
    moved: int = await conn.fetchval("SELECT request_log_create_partition($1::date)", day)
    return moved


async def ensure_partitions(conn: asyncpg.Connection, days: Iterable[date]) -> dict[str, int]:
    """Partitions for `days` and for every day with rows in the DEFAULT partition, in one
    transaction. Returns {"created": n, "moved_from_default": rows}. Days already
    partitioned are left alone, so calling it again is a no-op."""
    created = moved = 0
    async with conn.transaction():
        await lock(conn)
        # Writes into the DEFAULT partition wait while it is emptied (else a row landing
        # between the move and the attach would fail the attach); others go on.
        await conn.execute(f"LOCK TABLE {DEFAULT_PARTITION} IN SHARE ROW EXCLUSIVE MODE")
        existing = set(await partition_days(conn))
        wanted = set(days) | set(await default_days(conn))
        for day in sorted(wanted - existing):
            moved += await _create(conn, day)
            created += 1
    return {"created": created, "moved_from_default": moved}


def days_ahead(today: date, ahead: int) -> list[date]:
    """Today and the `ahead` days after it."""
    return [today + timedelta(days=n) for n in range(ahead + 1)]


class PartitionsBusyError(Exception):
    """The log was in use for longer than DROP_LOCK_TIMEOUT; nothing was dropped."""


# Dropping a partition locks the whole log: a long reader would make the DROP wait, and
# every write queue behind the waiting DROP. Past this, give up until the next pass.
DROP_LOCK_TIMEOUT = "5s"


async def drop_partitions_before(conn: asyncpg.Connection, cutoff: date) -> tuple[list[date], int]:
    """Drop every day partition older than `cutoff` (DROP TABLE: no row-by-row delete)
    and delete the DEFAULT partition's rows from before it (normally none: maintenance
    moves them into their days' partitions). Returns the days dropped and the rows
    deleted from the DEFAULT partition; PartitionsBusyError when the log stayed locked."""
    try:
        async with conn.transaction():
            await lock(conn)
            await conn.execute(f"SET LOCAL lock_timeout = '{DROP_LOCK_TIMEOUT}'")
            dropped = [day for day in await partition_days(conn) if day < cutoff]
            for day in dropped:  # as the owner, in request_log_drop_partition
                await conn.execute("SELECT request_log_drop_partition($1::date)", day)
            status = await conn.execute(
                f"DELETE FROM {DEFAULT_PARTITION} WHERE created_at < '{bounds(cutoff)[0]}'")
    except asyncpg.LockNotAvailableError as exc:
        raise PartitionsBusyError(f"request log busy, partitions not dropped: {exc}") from None
    return dropped, int(status.rsplit(" ", 1)[-1])
