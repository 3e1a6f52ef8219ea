"""Each stage's live figures for the dashboard, the rows `intentroute status` prints
(`shared.runtime.stage_status`): replicas, lag (pending, ack pending, redelivered),
dead letters, handled and errors since the replicas started, rate and p95 between two
readings.

A reading asks every replica over the services API and the server for each stage's
consumer (~0.3-1 s: the replies are gathered until 0.3 s pass without one), so readings
are shared: callers within `min_interval` of the last one get it, and concurrent
callers wait for the same one. The rate and p95 are over the time since the reading
before."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable

import msgspec
from nats.aio.client import Client
from nats.errors import Error as NatsError

from shared.contracts.errors import RetryableError
from shared.contracts.response import ErrorCode
from shared.runtime.stage_status import Sample, StageRow, read_sample, stage_rows

log = logging.getLogger("intentroute.doors.dashboard")


class StagesView(msgspec.Struct, kw_only=True):
    # When the reading was taken (UTC, ISO 8601); seconds since the one before (None
    # for the first reading: no rate, no windowed p95 yet).
    as_of: str
    interval_s: float | None
    stages: list[StageRow]


class StagesUnavailableError(RetryableError):
    """The bus did not answer the reading."""

    code = ErrorCode.BUS_UNAVAILABLE


async def _read(nc: Client, timeout: float) -> Sample:
    return await read_sample(nc, timeout=timeout)


class StageReader:
    def __init__(self, nc: Client, *, timeout: float = 1.0, min_interval: float = 5.0,
                 clock: Callable[[], float] = time.monotonic,
                 read: Callable[[Client, float], Awaitable[Sample]] = _read) -> None:
        self.nc = nc
        self.read = read
        self.timeout = timeout
        self.min_interval = min_interval
        self.clock = clock
        self._lock = asyncio.Lock()
        self._last: tuple[float, Sample, StagesView] | None = None

    async def view(self) -> StagesView:
        async with self._lock:
            if self._last is not None and self.clock() - self._last[0] < self.min_interval:
                return self._last[2]
            try:
                sample = await self.read(self.nc, self.timeout)
            except (NatsError, TimeoutError, OSError) as exc:
                raise StagesUnavailableError(f"{type(exc).__name__}: {exc}") from exc
            previous = self._last[1] if self._last is not None else None
            interval = round(sample.at - previous.at, 3) if previous is not None else None
            view = StagesView(
                as_of=dt.datetime.fromtimestamp(sample.at, dt.UTC).isoformat(),
                interval_s=interval, stages=stage_rows(sample, previous))
            self._last = (self.clock(), sample, view)
            return view
