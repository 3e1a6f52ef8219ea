"""Clocks that move only when the test moves them, for code handed a clock (the circuit
breaker, the supervisor, the server keeper, the agents' cache, the learning job).

`ManualClock`: seconds (a monotonic clock); `ManualUtcClock`: UTC datetimes (the
learning job's `clock()`). Calling one reads it; `advance` moves it; `now` may be set."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class ManualClock:
    """Seconds that move when told: `clock()` is `now`; `advance(s)`, or `sleep(s)` for
    code handed a sleep, moves it on."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)


class ManualUtcClock:
    """UTC time that moves when told: `clock()` is `now`; `advance(days=1, hours=2)`
    moves it on and returns the new time."""

    def __init__(self, now: datetime | None = None) -> None:
        self.now = now or datetime(2026, 3, 1, 12, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now
