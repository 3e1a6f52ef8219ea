"""A gateway replica's allowance of one agent's admissions (migration 0012): requests
admitted here, with no round trip, while the allowance lasts, and recorded in flight in
Postgres at the replica's next call for that agent (pure bookkeeping; the calls are
made by `gate.LimitGate`).

Postgres grants an allowance only while every limit has room for `SHARE` times it
after everything in flight and leased (each admission reserving the agent's cost and
token estimates), so an allowance never admits a request the per-request check would
refuse, unless a request costs more than its estimate; near any limit it grants none and
every request is decided there, one call each (several waiting requests share a call).
What an allowance costs is the other direction: its unused part is room another replica
cannot use until it is given back, so another replica may refuse early by at most the
allowances held elsewhere (each at most 1/SHARE of the room when it was granted and
at most what its replica admits in one LEASE_TTL), for at most LEASE_TTL.

How big and how often, measured with `bench pipeline --limits` (docs/explanation/
limits.md, Cost (measured)): the replica asks for what it admitted over the last lease
period (at least MIN_WANT), tops up when half is used or half of LEASE_TTL has passed,
and gives back what is left once its agent has asked nothing for IDLE_LEASES periods.
A flood at 400 requests a second then costs a few calls a second instead of 400.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import msgspec

from services.gateway.limits.ports import Ask, Grant, Held, Limits

# Seconds an allowance lasts, on the gateway's clock; topped up at half. Shorter costs
# more calls, longer leaves an idle replica's allowance unusable by others longer.
LEASE_TTL = 1.0
# An allowance takes at most 1/SHARE of the room any limit has left.
SHARE = 4
# Admissions asked for per allowance: at least MIN_WANT, at most MAX_WANT.
MIN_WANT = 8
MAX_WANT = 1024
# An agent's allowance is renewed in the background until it has asked nothing for
# IDLE_LEASES lease periods, then given back: an agent asking once a second keeps one,
# so its requests wait for no call either (two calls a second, off their path).
IDLE_LEASES = 3
# An allowance is not used in its last MARGIN seconds: the call that renews it takes
# time, and replicas' clocks differ (Postgres drops an allowance once it expires).
MARGIN = 0.05


class Call(msgspec.Struct, frozen=True):
    """What one call tells the shared state about this replica's allowance."""

    held: list[Held]  # admitted on it since the last call: to record in flight
    keep: int  # what is left of it and still used
    want: int  # more admissions asked for
    now: float


class AgentLease:
    """One agent's allowance at this replica, under one set of limits and prices."""

    def __init__(self, agent_id: str, limits: Limits, prices: Mapping[str, list[float]],
                 *, ttl: float = LEASE_TTL) -> None:
        self.agent_id = agent_id
        self.limits = limits
        self.prices = dict(prices)
        self.ttl = ttl
        self.allowance = 0
        self.until = 0.0
        self.estimate = 0.0
        # The allowance right after the last call (the top-up threshold is half of it).
        self.granted = 0
        self.held: list[Held] = []
        self.sending: list[Held] = []
        # Admissions on the allowance since the last call began, and when it began.
        self.taken = 0
        self.last_call: float | None = None
        # When the agent last asked (on the allowance or through a call).
        self.last_asked = 0.0

    def fits(self, limits: Limits, prices: Mapping[str, list[float]]) -> bool:
        return limits == self.limits and prices == self.prices

    def usable(self, now: float) -> bool:
        return self.allowance > 0 and now < self.until - MARGIN

    def take(self, ask: Ask, now: float) -> bool:
        """Admit `ask` on the allowance, if any is left: it reserves the estimate."""
        if not self.usable(now):
            return False
        self.allowance -= 1
        self.taken += 1
        self.last_asked = now
        self.held.append(Held(ask.request_id, ask.accepted_at, ask.deadline, self.estimate))
        return True

    def low(self, now: float) -> bool:
        """Time to top up: half of the allowance used, or half of its time gone."""
        return self.granted > 0 and (self.allowance <= self.granted // 2
                                     or now >= self.until - self.ttl / 2)

    def begin(self, asks: int, now: float, *, release: bool = False) -> Call:
        """The next call: the admissions to record, what is kept (nothing when the agent
        was idle for IDLE_LEASES periods or `release`, and nothing past its time), and
        what is asked for."""
        if asks:
            self.last_asked = now
        release = release or now - self.last_asked >= IDLE_LEASES * self.ttl
        keep = self.allowance if self.usable(now) and not release else 0
        want = 0 if release else max(self._target(asks, now) - keep, 0)
        self.allowance = keep
        self.sending, self.held = self.held, []
        self.taken = 0
        self.last_call = now
        return Call(self.sending, keep, want, now)

    def _target(self, asks: int, now: float) -> int:
        """What the replica will admit over a lease period at its recent rate."""
        if self.last_call is None:
            return MIN_WANT
        rate = (self.taken + asks) / max(now - self.last_call, 1e-3)
        return min(max(math.ceil(rate * self.ttl), MIN_WANT), MAX_WANT)

    def answered(self, call: Call, grant: Grant) -> None:
        """The call's grant: the allowance grows by it and lasts from the call's time."""
        self.sending = []
        self.allowance += grant.extra
        self.until = call.now + self.ttl
        self.estimate = grant.estimate
        self.granted = self.allowance

    def failed(self, call: Call) -> None:
        """The call did not answer: its admissions are recorded at the next one."""
        self.held = call.held + self.held
        self.sending = []

    def unsent(self) -> list[Held]:
        """Admissions not known to be recorded, handed to this lease's successor."""
        unsent, self.held = self.sending + self.held, []
        return unsent
