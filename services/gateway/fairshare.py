"""Which agent's requests the gateway takes next: weighted deficit round robin.

Pure logic on a clock it is given (the JetStream side is `fair_consumer.py`). Agents
with requests waiting are *active*; each visit of an active agent adds `quantum x
weight` to its deficit, and the gateway may take as many of its requests as the deficit
holds (whole requests). An agent whose pull came back short has nothing more waiting:
it leaves the active set and its deficit is reset (classic DRR, Shreedhar & Varghese
1995), so idle time earns no credit.

Newly active agents are served before the ones that were already busy (DRR++, as in
fq_codel's "new flows"): an agent asking once in a while gets its request through at
the next turn instead of after a whole round of floods, and a flooding agent never
benefits, because it is never idle. A new agent's first quantum is served from the new
list; once spent it joins the tail of the old list like everyone else.

A doorbell (the request's publication, seen on core NATS) can arrive before the stream
has stored the message; an agent found empty shortly after its doorbell is looked at
again after `RECHECK` delays rather than forgotten until the next scan.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping

# Seconds after an agent's doorbell during which an empty pull is looked at again, and
# the delays of those looks (the stream stores a message within a millisecond or two
# of its publication on loopback; the last look covers a busy server).
RING_GRACE = 0.5
RECHECK = (0.005, 0.025, 0.1)


class FairScheduler:
    """Weighted DRR over active agents, new arrivals first (module doc)."""

    def __init__(self, *, quantum: int, weight: Callable[[str], float]) -> None:
        if quantum < 1:
            raise ValueError("quantum must be at least one request")
        self.quantum = quantum
        self._weight = weight
        self._new: deque[str] = deque()
        self._old: deque[str] = deque()
        self._deficit: dict[str, float] = {}
        # Agent -> time of its last doorbell; looks found empty since; next look due.
        self._rang: dict[str, float] = {}
        self._looks: dict[str, int] = {}
        self._recheck: dict[str, float] = {}

    def weight(self, agent: str) -> float:
        try:
            weight = float(self._weight(agent))
        except Exception:  # a policy that cannot be read is the default share
            return 1.0
        return weight if weight > 0 else 1.0

    @property
    def active(self) -> list[str]:
        return [*self._new, *self._old]

    def __bool__(self) -> bool:
        return bool(self._new or self._old)

    def wake(self, agent: str, now: float, *, rang: bool = False) -> None:
        """`agent` may have requests waiting (a doorbell when `rang`, else a scan)."""
        if rang:
            self._rang[agent] = now
            self._looks.pop(agent, None)
        self._recheck.pop(agent, None)
        if agent in self._deficit:
            return
        self._deficit[agent] = self.quantum * self.weight(agent)
        self._new.append(agent)

    def pick(self, room: int) -> tuple[str, int] | None:
        """The agent to take requests from and how many (1..room), or None when no
        agent is active. The agent stays at the head until `served` is called."""
        if room < 1:
            return None
        while self._new or self._old:
            fresh = bool(self._new)
            agent = self._new[0] if fresh else self._old[0]
            deficit = self._deficit[agent]
            if deficit >= 1:
                return agent, min(int(deficit), room)
            # Its turn is spent: a fresh quantum, at the back of the busy agents.
            (self._new if fresh else self._old).popleft()
            self._deficit[agent] = deficit + self.quantum * self.weight(agent)
            self._old.append(agent)
        return None

    def served(self, agent: str, asked: int, got: int, now: float) -> None:
        """The pull `pick` chose returned `got` of the `asked` requests."""
        if agent not in self._deficit:
            return
        self._deficit[agent] -= got
        if got:
            self._looks.pop(agent, None)
        if got >= asked:
            return
        # Nothing more waiting: out of the round, its credit with it.
        self._drop(agent)
        rang = self._rang.get(agent)
        if rang is None:
            return
        looks = self._looks.get(agent, 0)
        if got == 0 and now - rang <= RING_GRACE and looks < len(RECHECK):
            # Perhaps rung before the stream stored it: look again shortly.
            self._recheck[agent] = now + RECHECK[looks]
            self._looks[agent] = looks + 1
        elif now - rang > RING_GRACE:
            self._rang.pop(agent, None)
            self._looks.pop(agent, None)

    def next_recheck(self) -> float | None:
        """When the earliest look again is due (None: none is)."""
        return min(self._recheck.values(), default=None)

    def due(self, now: float) -> list[str]:
        """Agents whose look again is due, made active again."""
        woken = [agent for agent, at in self._recheck.items() if at <= now]
        for agent in woken:
            self.wake(agent, now)
        return woken

    def _drop(self, agent: str) -> None:
        self._deficit.pop(agent, None)
        for queue in (self._new, self._old):
            if agent in queue:
                queue.remove(agent)

    def forget(self, agent: str) -> None:
        """Drop everything known of `agent` (its consumer cannot be read)."""
        self._drop(agent)
        self._rang.pop(agent, None)
        self._looks.pop(agent, None)
        self._recheck.pop(agent, None)


# Seconds over which the pipeline's drain rate is averaged (exponentially weighted).
DRAIN_WINDOW = 1.0


class DrainRate:
    """Messages a work-queue stream loses per second (acknowledged by its consumers),
    from successive readings of its counters: messages ever stored (`last_seq`) less
    those still there is what was removed; its change over time is the rate, averaged
    over about DRAIN_WINDOW seconds whatever the reading interval."""

    def __init__(self, window: float = DRAIN_WINDOW) -> None:
        self.window = window
        self.rate = 0.0
        self._last: tuple[float, int] | None = None

    def observe(self, now: float, stored: int, present: int) -> None:
        removed = stored - present
        if self._last is not None:
            then, before = self._last
            elapsed = now - then
            if elapsed > 0 and removed >= before:  # a purged or recreated stream: skip
                weight = 1.0 - math.exp(-elapsed / self.window)
                self.rate += weight * ((removed - before) / elapsed - self.rate)
        self._last = (now, removed)


class Hops:
    """Pipeline messages per request: deliveries at every stage consumer over those at
    the entry stage (the classifier's, where each request enters once), from successive
    readings of their delivered counters, averaged over about DRAIN_WINDOW seconds; 1
    until both have moved.

    The drain rate counts messages, one per hop, while the pipeline holds one message per
    request: the bound took that rate for requests, so it let `hops` times `delay` of
    waiting in (a RETRIEVAL request makes three hops: classify, retrieve, generate).
    Measured with `bench fairness` before this was divided out: victims waited ~250 ms
    at the generator's queue behind a flood with `delay` 0.1 s, five flooders or one
    (issue 32)."""

    def __init__(self, window: float = DRAIN_WINDOW) -> None:
        self.window = window
        self.value = 1.0
        self._last: tuple[float, int, int] | None = None

    def observe(self, now: float, delivered: int, entered: int) -> None:
        if self._last is not None:
            then, before, entered_before = self._last
            elapsed, hops, entries = now - then, delivered - before, entered - entered_before
            if elapsed <= 0 or hops < 0 or entries < 0:  # a consumer recreated: skip
                self._last = (now, delivered, entered)
                return
            if entries == 0:  # nothing entered: keep the reading to measure against
                return
            weight = 1.0 - math.exp(-elapsed / self.window)
            self.value += weight * (max(1.0, hops / entries) - self.value)
        self._last = (now, delivered, entered)


def pipeline_bound(floor: int, delay: float, rate: float, service: float = 0.0) -> int:
    """Pipeline messages admission may keep outstanding: what the drain `rate` clears in
    `service` seconds (the time a message stays in the pipeline when nothing waits:
    `Residence`) plus `delay` seconds of waiting, never fewer than `floor`; `delay` 0:
    the fixed `floor`.

    Without `service` the bound held `delay` seconds of *residence*, so a stage whose
    every message takes longer than `delay` (`bench chaos`'s echo generator, 0.4 s, with
    the bound's 0.1 s) ran at the floor's concurrency whatever its replicas could take:
    8 messages, 20 requests a second of the 40 offered, the rest queued in the agent's
    consumer from the first second (the "failover" of issue 32 was mostly that queue)."""
    if delay <= 0:
        return floor
    return max(floor, int(rate * (service + delay)))


# Seconds the pipeline must have been held at the floor before its residence is read:
# the drain rate, averaged over DRAIN_WINDOW, has caught up with what the floor lets
# through (read sooner it is low, the residence high).
RESIDENCE_SETTLE = 1.5


class Residence:
    """The time a message stays in the pipeline when the floor's messages keep it busy,
    by Little's law: messages present over the drain rate. Read only while the bound is
    the floor itself (`at_floor`: the drain times `delay` is under it) and the pipeline
    has held at least that many for RESIDENCE_SETTLE seconds; the least reading is kept.

    Only there does the reading say what the stages take rather than what the bound let
    wait: a stage that takes each message long but many at once (a remote model; `bench
    chaos`'s echo generator) holds the floor at a low rate for as long as the bound
    stays there, and P / rate is its service time; a fast pipeline leaves the floor
    within a fraction of a second of a flood's start, so it is never read and the bound
    is `delay` of the rate as before. Read under a flood instead (every message
    present, P / rate is the waiting the bound allowed), the residence let victims wait
    twice as long, and more (issue 32, measured: `bench fairness` victims' p95 1.15 s,
    five flooders 2.0 s)."""

    def __init__(self, settle: float = RESIDENCE_SETTLE) -> None:
        self.settle = settle
        self.least: float | None = None
        # Since when the floor has held, and the messages present summed over its readings.
        self._since: float | None = None
        self._present = (0, 0)

    def observe(self, now: float, present: int, rate: float, floor: int,
                at_floor: bool) -> None:
        # Half the floor: the count dips by the few messages acknowledged just before a
        # reading (`bench chaos` at the floor of 8 read 6 to 9).
        if not at_floor or 2 * present < floor or rate <= 0:
            self._since = None
            return
        if self._since is None:
            self._since, self._present = now, (0, 0)
        total, readings = self._present
        self._present = (total + present, readings + 1)
        if now - self._since < self.settle:
            return
        seconds = (total + present) / (readings + 1) / rate
        if self.least is None or seconds < self.least:
            self.least = seconds

    @property
    def seconds(self) -> float:
        return self.least or 0.0


def pipeline_room(bound: int, outstanding: int, stranded: int) -> int:
    """Admissions the bound leaves: `outstanding` pipeline messages (the last reading
    plus what was admitted since) less the `stranded` ones, which no live replica holds
    (a dead or stopped one does, until their ack wait redelivers them): they are no work
    ahead of a request admitted now, and counting them paused admission for up to an ack
    wait after every kill (issue 32)."""
    return bound - max(0, outstanding - stranded)


def stranded_now(ack_pending: Mapping[str, int], inflight: Mapping[str, int]) -> int:
    """Pipeline messages delivered and unacknowledged that no replica answering says it
    holds: per stage consumer, what the server counts as delivered and not acknowledged
    (`ack_pending`, by consumer name) less the sum of what that consumer's replicas that
    answered hold (`inflight`, by consumer name). A consumer no replica answered for
    counts none: with every replica of a stage gone nothing drains there, and the bound
    should hold."""
    return sum(max(0, held - inflight[name]) for name, held in ack_pending.items()
               if name in inflight)


# Readings in a row a message must be stranded in to be left out of the count: one
# reading's difference also holds messages on the wire or acknowledged between the two
# questions (a few), which the next reading does not repeat; a dead replica's stay an
# ack wait.
STRANDED_READINGS = 2


# Seconds a replica that stopped answering is remembered: its messages are redelivered
# an ack wait (STAGE_ACK_WAIT, 2 s) after its last sign of life, well within.
GONE_MEMORY = 10.0


class Stranded:
    """Pipeline messages held by replicas that no longer answer, over the last
    `readings` readings (the least of them; 0 until there are that many, or after a
    reading failed).

    Only a stage one of whose replicas stopped answering (seen within GONE_MEMORY, not in
    this reading) is counted: a busy live replica's deliveries still unread in its
    socket are delivered for the server and held by nobody for its own count, so
    without that condition a stage saturated under a flood would look stranded and
    admission would go past the bound."""

    def __init__(self, readings: int = STRANDED_READINGS, memory: float = GONE_MEMORY
                 ) -> None:
        self._last: deque[int] = deque(maxlen=readings)
        self.memory = memory
        # Stage consumer -> replica id -> when it last answered.
        self._seen: dict[str, dict[str, float]] = {}

    def observe(self, now: float, ack_pending: Mapping[str, int],
                inflight: Mapping[str, int], replicas: Mapping[str, set[str]]) -> None:
        """One reading: per stage consumer, what the server counts as delivered and not
        acknowledged, what the replicas that answered hold, and which answered."""
        gone: set[str] = set()
        for name, answered in replicas.items():
            seen = self._seen.setdefault(name, {})
            for replica in answered:
                seen[replica] = now
            for replica, at in list(seen.items()):
                if now - at > self.memory:
                    del seen[replica]
                elif replica not in answered:
                    gone.add(name)
        self._last.append(stranded_now(
            {name: held for name, held in ack_pending.items() if name in gone}, inflight))

    def unknown(self) -> None:
        """A reading failed: nothing is left out until `readings` succeed again."""
        self._last.clear()

    @property
    def count(self) -> int:
        if len(self._last) < (self._last.maxlen or 1):
            return 0
        return min(self._last)
