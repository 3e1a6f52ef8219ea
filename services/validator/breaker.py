"""Circuit breaker guarding the AVAP parser (ADR-0009, Decision 1).

    CLOSED    --[threshold consecutive failures]--> OPEN
    OPEN      --[cooldown elapsed]----------------> HALF_OPEN
    HALF_OPEN --[probe succeeds]------------------> CLOSED
    HALF_OPEN --[probe fails]---------------------> OPEN (fresh cooldown)

Pure logic with an injectable clock: no I/O, no timers. The OPEN -> HALF_OPEN transition
happens lazily when the state is read. Callers ask `allow()` before every call and report
the outcome with `record_success()` / `record_failure()` (or `release()` if the call was
abandoned without an outcome, e.g. cancelled).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable

log = logging.getLogger("intentroute.validator")

DEFAULT_THRESHOLD = 3
DEFAULT_COOLDOWN = 30.0


class BreakerState(enum.StrEnum):
    CLOSED = "CLOSED"
    OPEN = "OPEN"
    HALF_OPEN = "HALF_OPEN"


class CircuitBreaker:
    def __init__(
        self,
        threshold: int = DEFAULT_THRESHOLD,
        cooldown: float = DEFAULT_COOLDOWN,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if threshold < 1:
            raise ValueError("threshold must be >= 1")
        if cooldown < 0:
            raise ValueError("cooldown must be >= 0")
        self.threshold = threshold
        self.cooldown = cooldown
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._failures = 0  # consecutive, while CLOSED
        self._opened_at = 0.0
        self._probe_in_flight = False

    @property
    def state(self) -> BreakerState:
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self.cooldown:
            self._transition(BreakerState.HALF_OPEN)
        return self._state

    def allow(self) -> bool:
        """May a call be attempted now? In HALF_OPEN only one probe at a time gets True."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN and not self._probe_in_flight:
            self._probe_in_flight = True
            return True
        return False

    def record_success(self) -> None:
        state = self.state
        if state is BreakerState.CLOSED:
            self._failures = 0
        elif state is BreakerState.HALF_OPEN:
            self._probe_in_flight = False
            self._failures = 0
            self._transition(BreakerState.CLOSED)
        # OPEN: a straggler started before the circuit opened; only a probe may close it.

    def record_failure(self) -> None:
        state = self.state
        if state is BreakerState.CLOSED:
            self._failures += 1
            if self._failures >= self.threshold:
                self._open()
        elif state is BreakerState.HALF_OPEN:
            self._probe_in_flight = False
            self._open()
        # OPEN: a straggler's failure must not extend the cooldown.

    def release(self) -> None:
        """Give back a permit without an outcome (the call was cancelled)."""
        self._probe_in_flight = False

    def _open(self) -> None:
        self._opened_at = self._clock()
        self._failures = 0
        self._transition(BreakerState.OPEN)

    def _transition(self, new: BreakerState) -> None:
        old, self._state = self._state, new
        if new is BreakerState.OPEN:
            log.warning("[ptvl] circuit OPEN — skipping parser")
        elif new is BreakerState.HALF_OPEN:
            log.info("[ptvl] circuit HALF-OPEN — probing parser availability")
        elif old is not BreakerState.CLOSED:
            log.info("[ptvl] circuit CLOSED — parser reachable")
