"""The port of the per-agent limits' shared state (`LimitStore`, implemented by
`store.PgLimits`; tests pass fakes) and the values it speaks: which limits apply to an
agent, a request waiting for a verdict or admitted on an allowance, the verdicts and the
grant. `logic`, `lease`, `gate` and `store` import them from here."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Protocol

import msgspec

from shared.contracts.response import ErrorCode
from shared.policy.agent import OnBudget


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """The limits that apply to one agent (None: no such limit)."""

    rate: float | None = None
    burst: int | None = None
    max_inflight: int | None = None
    tokens_per_min: int | None = None
    budget_day: float | None = None
    budget_month: float | None = None
    on_budget: OnBudget = OnBudget.REFUSE

    @property
    def unlimited(self) -> bool:
        """No limit at all: nothing to check (no round trip)."""
        return (self.rate is None and self.max_inflight is None and self.tokens_per_min is None
                and self.budget_day is None and self.budget_month is None)


class Verdict(enum.StrEnum):
    """What the shared state decided for one request."""

    ADMIT = "ok"
    DEGRADE = "degrade"  # past a budget, on_budget=degrade: the extractive answer
    RATE_LIMITED = ErrorCode.RATE_LIMITED.value
    CONCURRENCY_LIMITED = ErrorCode.CONCURRENCY_LIMITED.value
    QUOTA_EXCEEDED = ErrorCode.QUOTA_EXCEEDED.value
    BUDGET_EXCEEDED = ErrorCode.BUDGET_EXCEEDED.value
    # Under a budget, before any of the agent's requests has a known cost: one in
    # flight at a time (refused CONCURRENCY_LIMITED), so the overshoot bound holds.
    PROBE = "probe"


class Admission(msgspec.Struct, frozen=True, kw_only=True):
    """The verdict on one request and the agent's state after it."""

    verdict: Verdict
    retry_after_ms: int = 0
    # Cost units spent (answered, settled) this UTC day / month, and reserved for the
    # agent's requests in flight (this one included when admitted).
    spent_day: float = 0.0
    spent_month: float = 0.0
    reserved: float = 0.0


ADMITTED = Admission(verdict=Verdict.ADMIT)


class Ask(msgspec.Struct, frozen=True):
    """One request waiting for the shared state's verdict."""

    request_id: str
    accepted_at: float
    deadline: float


class Held(msgspec.Struct, frozen=True):
    """One request a replica admitted on its allowance, to be recorded in flight with the
    cost units it reserves."""

    request_id: str
    accepted_at: float
    deadline: float
    estimate: float


class Grant(msgspec.Struct, frozen=True, kw_only=True):
    """The shared state's answer to a replica: the verdict on each request it asked
    about, in order, and `extra` more admissions it may make on its own (each reserving
    `estimate` cost units) until its allowance expires."""

    admissions: list[Admission]
    extra: int = 0
    estimate: float = 0.0


class LimitStore(Protocol):
    """The per-agent limits' state shared by every gateway replica
    (`limits.store.PgLimits`)."""

    async def lease(self, agent_id: str, *, replica: str, seq: int, asks: Sequence[Ask],
                    held: Sequence[Held], keep: int, want: int, ttl: float, share: int,
                    limits: Limits, prices: Mapping[str, list[float]], now: float) -> Grant:
        """Record `held` (admitted on `replica`'s allowance) in flight, settle the
        agent's answered requests, decide each of `asks` in order (`now`: epoch seconds;
        an admitted one counts in flight until its request-log row is written or its
        deadline passes), and grant the replica at most `want` more admissions beside
        the `keep` it still holds, for `ttl` seconds, each within 1/`share` of every
        limit's room (`seq`: the replica's call number; a late call grants nothing)."""
        ...
