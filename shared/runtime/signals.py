"""What a worker knows about its own work, in one place, for every exporter to read.

A worker's stage consumers count here (`StageStats`: messages by outcome, processing
time, latency buckets, redeliveries), a poller keeps the consumer's lag (`Lag`), and a
service registers the state of what it guards (the validator's breaker). Two exporters
read the same figures: the NATS services API (`shared.runtime.micro`, `$SRV.STATS`) and the
OpenTelemetry metrics (`shared.runtime.metrics`, Prometheus). Plain counters, no I/O: recording
one message costs a bisect and a few additions on the hot path.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field


class Outcome(enum.StrEnum):
    """How the handling of one delivery ended."""

    OK = "ok"  # handed off, or answered
    ERROR = "error"  # answered with a typed error (permanent, deadline, bad input)
    RETRY = "retry"  # given back for redelivery (an outage, a timeout)
    DEAD_LETTER = "dead_letter"  # last delivery: answered and parked in the DLQ
    DUPLICATE = "duplicate"  # a redelivery whose answer had already gone out
    FAILED = "failed"  # the handler itself raised (the connection, a bug)


# Outcomes the services API counts as errors (`num_errors`).
ERROR_OUTCOMES = frozenset({Outcome.ERROR, Outcome.RETRY, Outcome.DEAD_LETTER, Outcome.FAILED})

# Upper bounds (seconds) of the latency buckets, shared by the Prometheus histogram and
# the buckets `$SRV.STATS` carries, so `intentroute status` and a dashboard agree.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0,
)


@dataclass
class StageStats:
    """One stage's counts since this replica started."""

    stage: str
    handled: int = 0
    processing_ns: int = 0
    redelivered: int = 0
    inflight: int = 0
    # Delivered and waiting for a free slot (StageSpec.lookahead): held by this replica.
    waiting: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: {o.value: 0 for o in Outcome})
    # One count per LATENCY_BUCKETS bound, plus the overflow bucket (not cumulative).
    buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    last_error: str = ""

    def record(self, outcome: Outcome, seconds: float, deliveries: int = 1) -> None:
        self.handled += 1
        self.processing_ns += int(seconds * 1e9)
        self.outcomes[outcome] += 1
        self.buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        if deliveries > 1:
            self.redelivered += 1

    @property
    def errors(self) -> int:
        return sum(self.outcomes[o] for o in ERROR_OUTCOMES)

    @property
    def dead_letters(self) -> int:
        return self.outcomes[Outcome.DEAD_LETTER]

    def snapshot(self) -> dict[str, object]:
        """The figures `$SRV.STATS` carries in an endpoint's `data`."""
        return {"outcomes": dict(self.outcomes), "redelivered": self.redelivered,
                "inflight": self.inflight, "waiting": self.waiting, "buckets": list(self.buckets),
                "bounds": list(LATENCY_BUCKETS)}


def quantile(counts: Sequence[int], q: float, bounds: Sequence[float] = LATENCY_BUCKETS
             ) -> float | None:
    """The q-quantile (seconds) of bucketed latencies, interpolated inside its bucket as
    Prometheus' histogram_quantile does; None without samples. The overflow bucket
    reports its lower bound (nothing is known above it)."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for i, count in enumerate(counts):
        if count and seen + count >= rank:
            if i >= len(bounds):
                return float(bounds[-1])
            lower = bounds[i - 1] if i > 0 else 0.0
            return lower + (bounds[i] - lower) * (rank - seen) / count
        seen += count
    return float(bounds[-1])


def bucket_delta(now: Sequence[int], before: Sequence[int] | None) -> list[int]:
    """Counts added between two cumulative samples (a restarted replica: all of `now`)."""
    if before is None or len(before) != len(now) or any(
            b > n for n, b in zip(now, before, strict=True)):
        return list(now)
    return [n - b for n, b in zip(now, before, strict=True)]


def merge_buckets(rows: Iterable[Sequence[int]]) -> list[int]:
    merged: list[int] = []
    for row in rows:
        if not merged:
            merged = [0] * len(row)
        for i, count in enumerate(row[:len(merged)]):
            merged[i] += count
    return merged


@dataclass(frozen=True)
class Lag:
    """A stage's durable consumer as the server last reported it (shared by replicas)."""

    pending: int = 0  # in the stream, not yet delivered to any replica
    ack_pending: int = 0  # delivered, not yet acknowledged
    redelivered: int = 0  # delivered more than once and not yet acknowledged
    waiting: int = 0  # pull requests waiting (replicas idle for want of work)


BREAKER_LEVELS: Mapping[str, int] = {"CLOSED": 0, "HALF_OPEN": 1, "OPEN": 2}


@dataclass
class WorkerSignals:
    """Everything a worker exports: per-stage stats and lag, and named state readers."""

    service: str
    stages: dict[str, StageStats] = field(default_factory=dict)
    lag: dict[str, Lag] = field(default_factory=dict)
    # Dead letters parked in the dead-letter stream, per stage (polled with the lag).
    dead_letters_stored: dict[str, int] = field(default_factory=dict)
    breakers: dict[str, Callable[[], str]] = field(default_factory=dict)
    # Named one-line states of what the worker depends on (the generator's model backend:
    # "ok: ...", "failing: ..."), read when the services API is asked for STATS.
    states: dict[str, Callable[[], str]] = field(default_factory=dict)
    # Every stage consumer of the worker started and not stopping (a readiness probe).
    consuming: bool = False

    def stage(self, name: str) -> StageStats:
        return self.stages.setdefault(name, StageStats(name))

    def watch_breaker(self, name: str, state: Callable[[], str]) -> None:
        """Export a circuit breaker's state (CLOSED / HALF_OPEN / OPEN) under `name`."""
        self.breakers[name] = state

    def breaker_states(self) -> dict[str, str]:
        return {name: str(read()) for name, read in self.breakers.items()}

    def watch_state(self, name: str, state: Callable[[], str]) -> None:
        """Export a one-line state under `name` (`intentroute status` shows it); its
        first word says how it is ("ok", "failing", ...)."""
        self.states[name] = state

    def state_lines(self) -> dict[str, str]:
        return {name: str(read()) for name, read in self.states.items()}
