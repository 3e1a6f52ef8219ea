"""New and dropped answer-cache entries, pushed by Postgres: LISTEN on
`intentroute_answer_cache` (migration 0019 NOTIFYs `+<id>` for each entry stored and
`-<id>` for each one deleted: evicted, expired, invalidated by an ingest, cleared, or
evicted by a verdict).

One connection of its own per process, outside the hot path's pool (the pattern of
shared.store.agent_changes). When it is lost, notifications sent meanwhile are lost
too: the listener connects again (backing off up to RETRY_MAX seconds) and then calls
`on_resync`, which reloads every live entry from the table, the source of truth.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import asyncpg

from shared.common.tasks import cancel_and_wait
from shared.store.writer import UNREACHABLE

log = logging.getLogger("intentroute.cache")

CHANNEL = "intentroute_answer_cache"
RETRY_MIN = 0.25
RETRY_MAX = 5.0


def parse(payload: str) -> tuple[bool, int] | None:
    """(`added`, entry id) of a notification; None if it is not one."""
    sign, digits = payload[:1], payload[1:]
    if sign not in ("+", "-") or not digits.isdigit():
        return None
    return sign == "+", int(digits)


class CacheChanges:
    """Calls `on_added(id)` / `on_removed(id)` per notification, `on_resync()` when the
    listening connection is back after a loss (changes may have been missed)."""

    def __init__(self, dsn: str, *, on_added: Callable[[int], None],
                 on_removed: Callable[[int], None], on_resync: Callable[[], None]) -> None:
        self._dsn = dsn
        self._on_added = on_added
        self._on_removed = on_removed
        self._on_resync = on_resync
        self._task: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()

    def start(self) -> CacheChanges:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="answer-cache-changes")
        return self

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        change = parse(payload)
        if change is None:
            return
        added, entry_id = change
        (self._on_added if added else self._on_removed)(entry_id)

    async def _run(self) -> None:
        wait = RETRY_MIN
        first = True
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await asyncpg.connect(self._dsn)
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                await conn.add_listener(CHANNEL, self._notified)
                if not first:
                    self._on_resync()  # what changed while it was away is not known
                first, wait = False, RETRY_MIN
                self.listening.set()
                await lost.wait()
                log.warning("answer cache: the listening connection was lost; reconnecting")
            except asyncio.CancelledError:
                raise
            except (*UNREACHABLE, asyncpg.PostgresError) as exc:
                log.warning("answer cache: not listening (%s); retry in %.2gs",
                            type(exc).__name__, wait)
            finally:
                self.listening.clear()
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(conn.close(), 1.0)
            first = False
            await asyncio.sleep(wait)
            wait = min(wait * 2, RETRY_MAX)
