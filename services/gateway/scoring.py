"""Feedback -> updated agent scores within seconds, from the gateway.

The feedback entry points `mark` the agent whose verdict they stored; every `interval`
seconds the agents marked since are refreshed in one `refresh_scores` call (their
counts, the global rows, every score). Marking costs a set insertion, so a burst of
feedback costs one refresh per interval, not one per message. Implicit outcomes (the
pipeline's, recorded by every stage's writer) reach the scores at the next full refresh:
the learning job's, or this task's own every `full_interval` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

import asyncpg

from shared.common.tasks import cancel_and_wait
from shared.policy.confidence import ConfidenceParams
from shared.store.scores import refresh_scores

log = logging.getLogger("intentroute.gateway.scores")


def utc_now() -> datetime:
    return datetime.now(UTC)


class ScoreRefresher:
    def __init__(
        self,
        pool: asyncpg.Pool,
        params: ConfidenceParams,
        *,
        interval: float,
        full_interval: float,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self._pool = pool
        self._params = params
        self._interval = interval
        self._full_interval = full_interval
        self._clock = clock
        self._dirty: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._last_full = time.monotonic()

    def mark(self, agent_id: str) -> None:
        self._dirty.add(agent_id)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="score-refresher")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self._dirty:  # what was marked last still gets its scores
            with contextlib.suppress(Exception):
                await self.refresh_marked()

    async def refresh_marked(self) -> None:
        agents, self._dirty = self._dirty, set()
        if not agents:
            return
        try:
            async with self._pool.acquire() as conn:
                await refresh_scores(conn, self._clock(), agents=sorted(agents),
                                     params=self._params)
        except Exception:
            self._dirty |= agents  # tried again at the next interval
            raise

    async def refresh_all_if_due(self) -> bool:
        """Every agent's scores, once `full_interval` seconds have passed since the last
        time (0: never; the learning job does it)."""
        if self._full_interval <= 0 or time.monotonic() - self._last_full < self._full_interval:
            return False
        async with self._pool.acquire() as conn:
            await refresh_scores(conn, self._clock(), params=self._params)
        self._last_full = time.monotonic()
        return True

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.refresh_marked()
                await self.refresh_all_if_due()
            except Exception as exc:  # the database away: the next interval tries again
                log.warning("[scores] refresh failed: %r", exc)
