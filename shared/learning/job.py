"""The learning job (ADR-0006): an ordered list of named phases run under a Postgres
advisory lock, so two replicas (or a replica and `intentroute learn`) never run it at
once; `LearnLoop` runs it every LEARN_INTERVAL seconds inside the learner worker.

A phase is `async (db, clock) -> figures`: `db` is the connection holding the lock,
`clock()` the current UTC time (tests pass their own). A phase that fails is logged
and recorded with its error; the phases after it still run (the A/B verdicts do not
wait on the rollups).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg

from shared.accounting.phase import accounting_phase
from shared.common.tasks import cancel_and_wait
from shared.learning.phases import Clock, PolicyLearning
from shared.learning.settings import LearnSettings
from shared.store import asyncpg_dsn
from shared.store.scores import refresh_scores

log = logging.getLogger("intentroute.learning")

PhaseFn = Callable[[asyncpg.Connection, Clock], Awaitable[dict[str, Any]]]

# pg_try_advisory_lock key of the learning job ("learn" in ASCII).
LOCK_KEY = 0x6C6561726E


@dataclass(frozen=True)
class Phase:
    name: str
    run: PhaseFn


def utc_now() -> datetime:
    return datetime.now(UTC)


def _scores_phase(settings: LearnSettings) -> PhaseFn:
    async def run(conn: asyncpg.Connection, clock: Clock) -> dict[str, Any]:
        report = await refresh_scores(conn, clock(), params=settings.confidence)
        return {"agents": report.agents, "rows": report.rows,
                "diverged": len(report.diverged), "newly_diverged": len(report.newly_diverged)}

    return run


def default_phases(settings: LearnSettings) -> list[Phase]:
    """ADR-0006's phases in order, fresh for one run."""
    learning = PolicyLearning(settings)
    return [
        # Phase 1: global aggregates -> daily rollups, partitions ahead, retention.
        Phase("rollups", accounting_phase(settings.log_hot_days, settings.rollup_keep_days)),
        Phase("slices", learning.slices),  # phase 2: per-agent slices
        Phase("scores", _scores_phase(settings)),  # phase 3: per-agent confidence
        Phase("propose", learning.propose),  # phase 4: per-agent routing rules ...
        Phase("observe", learning.observe),  # ... checked in observe mode
        Phase("ab", learning.ab),  # phase 5: A/B share, promotion or rejection
    ]


async def run_job(conn: asyncpg.Connection, phases: Sequence[Phase],
                  clock: Clock = utc_now) -> dict[str, Any]:
    """Run the phases if no one else is: a summary of what each did and how long it
    took (`ran` false when another run holds the lock)."""
    if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_KEY):
        return {"ran": False, "reason": "another learning job is running (advisory lock held)"}
    started, t0 = clock(), time.perf_counter()
    summary: dict[str, Any] = {"ran": True, "ok": True, "started_at": started.isoformat(),
                               "phases": {}}
    try:
        for phase in phases:
            t1 = time.perf_counter()
            try:
                figures = await phase.run(conn, clock)
            except Exception as exc:  # one failed phase never takes the run down
                log.exception("learning: phase %s failed", phase.name)
                figures, summary["ok"] = {"error": f"{type(exc).__name__}: {exc}"}, False
            summary["phases"][phase.name] = {
                "seconds": round(time.perf_counter() - t1, 3), **figures}
        summary["seconds"] = round(time.perf_counter() - t0, 3)
        await conn.execute(
            "INSERT INTO learning_runs (started_at, seconds, ok, summary) "
            "VALUES ($1, $2, $3, $4::jsonb)",
            started, summary["seconds"], summary["ok"], json.dumps(summary, default=str))
    finally:
        if not conn.is_closed():
            await conn.execute("SELECT pg_advisory_unlock($1)", LOCK_KEY)
    return summary


async def learn_once(database_url: str, settings: LearnSettings, *, clock: Clock = utc_now,
                     phases: Callable[[LearnSettings], Sequence[Phase]] = default_phases,
                     ) -> dict[str, Any]:
    """One run on its own connection (it holds the lock for the run)."""
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        return await run_job(conn, phases(settings), clock)
    finally:
        await conn.close()


class LearnLoop:
    """The learning job every `settings.interval` seconds, in the background of a worker
    (its first run one interval after start). A failed run is logged; the loop goes on."""

    def __init__(self, database_url: str, settings: LearnSettings, *,
                 clock: Clock = utc_now,
                 phases: Callable[[LearnSettings], Sequence[Phase]] = default_phases,
                 on_run: Callable[[dict[str, Any]], None] | None = None) -> None:
        if settings.interval <= 0:
            raise ValueError("LearnLoop needs LEARN_INTERVAL > 0")
        self._url, self._settings, self._clock = database_url, settings, clock
        self._phases, self._on_run = phases, on_run
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="learning-job")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._settings.interval)
            try:
                summary = await learn_once(self._url, self._settings, clock=self._clock,
                                           phases=self._phases)
            except Exception:  # the database may be away for a while: try next time
                log.exception("learning: run failed")
                continue
            if summary["ran"]:
                log.info("learning: run took %.2f s: %s", summary["seconds"],
                         json.dumps(summary["phases"], default=str))
            if self._on_run is not None:
                self._on_run(summary)

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
