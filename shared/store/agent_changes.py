"""Changes to agents, pushed by Postgres: LISTEN on `intentroute_agents` (migration 0015
NOTIFYs it with the agent id of every row inserted, updated or deleted).

A cache of agent records (shared.auth.identity.CachedAgents) forgets an agent the moment
its row changes, so a revocation reaches every door within a round trip instead of a
cache's TTL. One connection of its own per process, outside the hot path's pool. When it
is lost, notifications sent meanwhile are lost too: the listener connects again (backing
off up to RETRY_MAX seconds) and then calls `on_resync`, which forgets every record;
until then the cache's TTL still bounds how stale a record can be.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import asyncpg

from shared.common.tasks import cancel_and_wait
from shared.store.writer import UNREACHABLE

log = logging.getLogger("intentroute.store")

CHANNEL = "intentroute_agents"
RETRY_MIN = 0.25
RETRY_MAX = 5.0


class AgentChanges:
    """Calls `on_change(agent_id)` for every agents-row change, `on_resync()` after the
    listening connection was lost and is back (changes may have been missed)."""

    def __init__(self, dsn: str, on_change: Callable[[str], None],
                 on_resync: Callable[[], None]) -> None:
        self._dsn = dsn
        self._on_change = on_change
        self._on_resync = on_resync
        self._task: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()

    def start(self) -> AgentChanges:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="agent-changes")
        return self

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        self._on_change(payload)

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
                log.warning("agent changes: the listening connection was lost; reconnecting")
            except asyncio.CancelledError:
                raise
            except (*UNREACHABLE, asyncpg.PostgresError) as exc:
                log.warning("agent changes: not listening (%s); retry in %.2gs",
                            type(exc).__name__, wait)
            finally:
                self.listening.clear()
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(conn.close(), 1.0)
            first = False
            await asyncio.sleep(wait)
            wait = min(wait * 2, RETRY_MAX)
