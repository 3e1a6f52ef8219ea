"""Per-agent limits, the pure parts: the policy keys `agent set` accepts, which limits
apply to an agent (its policy over the global defaults), the LIMIT_* settings, and the
refusal each verdict becomes; the gate on a fake store and clock."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from services.gateway.limits.gate import LimitGate
from services.gateway.limits.lease import IDLE_LEASES, MARGIN, MIN_WANT, AgentLease
from services.gateway.limits.logic import REFUSALS, price_table, refusal, resolve
from services.gateway.limits.ports import ADMITTED, Admission, Ask, Grant, Held, Limits, Verdict
from services.gateway.limits.settings import LimitSettings
from shared.contracts.pipeline import Admitted
from shared.contracts.request import AgentRequest
from shared.contracts.response import ErrorCode
from shared.policy.agent import (
    UNLIMITED,
    AgentPolicy,
    OnBudget,
    PolicyError,
    Price,
    apply_assignment,
    decode_policy,
    encode_policy,
)
from testkit.fakes import FakeLimits, FakePolicies


def apply(*assignments: str) -> AgentPolicy:
    policy = AgentPolicy()
    for assignment in assignments:
        policy = apply_assignment(policy, assignment)
    return policy


def test_agent_set_keys_of_the_issue_round_trip() -> None:
    policy = apply("rate=20/s", "burst=40", "max_inflight=8", "tokens_per_min=20000",
                   "budget_day=5.0", "budget_month=100", "on_budget=degrade", "weight=1")
    assert (policy.rate, policy.burst, policy.max_inflight, policy.tokens_per_min) == (
        20.0, 40, 8, 20000)
    assert (policy.budget_day, policy.budget_month, policy.weight) == (5.0, 100.0, 1.0)
    assert policy.on_budget is OnBudget.DEGRADE
    assert decode_policy(encode_policy(policy)) == policy


@pytest.mark.parametrize(("value", "per_second"), [
    ("20", 20.0), ("20/s", 20.0), ("1200/min", 20.0), ("5 per 10 seconds", 0.5),
    ("3600/hour", 1.0), ("2/second", 2.0)])
def test_a_rate_is_read_in_any_unit_as_requests_a_second(value: str, per_second: float) -> None:
    assert apply(f"rate={value}").rate == pytest.approx(per_second)


def test_off_turns_a_limit_off_and_empty_brings_back_the_default() -> None:
    assert apply("max_inflight=off").max_inflight == UNLIMITED
    assert apply("max_inflight=4", "max_inflight=").max_inflight is None


@pytest.mark.parametrize("assignment", [
    "rate=fast", "rate=0", "rate=3/fortnight", "burst=0", "burst=1.5", "max_inflight=-1",
    "tokens_per_min=1e400", "budget_day=-1", "budget_month=nan", "on_budget=maybe",
    "weight=0"])
def test_refused_values_say_which_key(assignment: str) -> None:
    with pytest.raises(PolicyError, match=assignment.split("=")[0]):
        apply(assignment)


DEFAULTS = LimitSettings(rate=1000.0, max_inflight=512)


def test_the_shipped_defaults_limit_nobody_and_cost_no_round_trip() -> None:
    assert resolve(AgentPolicy(), LimitSettings()).unlimited


def test_the_policy_overrides_each_global_default() -> None:
    assert resolve(AgentPolicy(), DEFAULTS) == Limits(rate=1000.0, burst=2000, max_inflight=512)
    own = resolve(apply("rate=20/s", "max_inflight=off", "budget_day=5",
                        "on_budget=degrade"), DEFAULTS)
    # The agent's own rate gets its own burst (two seconds of it), not the global one.
    assert own == Limits(rate=20.0, burst=40, max_inflight=None, budget_day=5.0,
                         on_budget=OnBudget.DEGRADE)
    assert resolve(apply("rate=0.1", "burst=3"), DEFAULTS).burst == 3
    assert resolve(apply("rate=0.1"), DEFAULTS).burst == 1  # at least one request
    everything_off = apply("rate=off", "max_inflight=off")
    assert resolve(everything_off, DEFAULTS).unlimited


def test_limit_settings_read_off_rates_and_counts() -> None:
    read = LimitSettings.from_env({"LIMIT_RATE": "60/min", "LIMIT_BURST": "5",
                                   "LIMIT_MAX_INFLIGHT": "off", "LIMIT_BUDGET_DAY": "2.5",
                                   "LIMIT_ON_BUDGET": "degrade"})
    assert (read.rate, read.burst, read.max_inflight, read.budget_day, read.on_budget) == (
        1.0, 5, None, 2.5, OnBudget.DEGRADE)
    assert resolve(AgentPolicy(), read).burst == 5
    with pytest.raises(ValueError, match="LIMIT_MAX_INFLIGHT"):
        LimitSettings.from_env({"LIMIT_MAX_INFLIGHT": "0"})
    with pytest.raises(ValueError, match="LIMIT_RATE"):
        LimitSettings.from_env({"LIMIT_RATE": "lots"})


LIMITS = Limits(rate=20.0, burst=40, max_inflight=8, tokens_per_min=100, budget_day=5.0)


@pytest.mark.parametrize(("verdict", "code"), [
    (Verdict.RATE_LIMITED, ErrorCode.RATE_LIMITED),
    (Verdict.CONCURRENCY_LIMITED, ErrorCode.CONCURRENCY_LIMITED),
    (Verdict.PROBE, ErrorCode.CONCURRENCY_LIMITED),
    (Verdict.QUOTA_EXCEEDED, ErrorCode.QUOTA_EXCEEDED),
    (Verdict.BUDGET_EXCEEDED, ErrorCode.BUDGET_EXCEEDED)])
def test_each_refusal_has_its_code_and_retry_after(verdict: Verdict, code: ErrorCode) -> None:
    refused = refusal(Admission(verdict=verdict, retry_after_ms=1500, spent_day=5.2), LIMITS)
    assert refused is not None
    assert (refused.code, refused.retry_after_ms) == (code, 1500)
    assert code in REFUSALS
    assert refused.message
    assert "\n" not in refused.message


def test_admitted_and_degraded_requests_are_not_refused() -> None:
    assert refusal(Admission(verdict=Verdict.ADMIT), LIMITS) is None
    assert refusal(Admission(verdict=Verdict.DEGRADE), LIMITS) is None


def envelope() -> Admitted:
    return Admitted(request=AgentRequest(request_id="r1", session_id="s", query="q",
                                         agent_id="a"), accepted_at=100.0, deadline=220.0)


async def test_the_gate_asks_the_store_with_the_agents_limits_prices_and_clock() -> None:
    store = FakeLimits(Admission(verdict=Verdict.RATE_LIMITED))
    policy = apply("rate=2/s", "price.m=1,2,3")
    gate = LimitGate(store, FakePolicies({"a": policy}), DEFAULTS, clock=lambda: 123.5)
    admission, limits = await gate.check(envelope())
    assert admission.verdict == Verdict.RATE_LIMITED
    assert store.calls == [{"agent_id": "a", "request_id": "r1", "accepted_at": 100.0,
                            "deadline": 220.0, "limits": limits, "prices": {"m": [1, 2, 3]},
                            "now": 123.5}]
    assert limits.rate == 2.0


async def test_an_agent_without_any_limit_costs_no_round_trip() -> None:
    store = FakeLimits(Admission(verdict=Verdict.RATE_LIMITED))
    gate = LimitGate(store, FakePolicies({"a": apply("rate=off", "max_inflight=off")}),
                     DEFAULTS)
    admission, _ = await gate.check(envelope())
    assert (admission.verdict, store.calls) == (Verdict.ADMIT, [])


def test_prices_are_passed_as_the_cost_reports_triples() -> None:
    policy = AgentPolicy(prices={"m": Price(0.5, 1.5, 0.01)})
    assert price_table(policy) == {"m": [0.5, 1.5, 0.01]}


class _HungLimits:
    """A limits store that never answers (Postgres paused)."""

    def __init__(self) -> None:
        self.calls = 0

    async def lease(self, *args: object, **kwargs: object) -> Grant:
        import asyncio

        self.calls += 1
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_database_that_does_not_answer_admits_unchecked_and_is_asked_again_later(
) -> None:
    store = _HungLimits()
    gate = LimitGate(store, FakePolicies({"a": apply("rate=2/s")}), DEFAULTS, wait=0.01)
    first, _ = await gate.check(envelope())
    second, _ = await gate.check(envelope())
    # Admitted without waiting for the database; the second not even asked.
    assert (first.verdict, second.verdict, store.calls) == (Verdict.ADMIT, Verdict.ADMIT, 1)
    gate._unchecked_until = 0.0  # UNCHECKED_FOR has passed
    await gate.check(envelope())
    assert store.calls == 2


def lease_with(allowance: int, *, at: float = 1000.0, ttl: float = 1.0) -> AgentLease:
    """A lease whose last call (at `at`) granted `allowance`."""
    lease = AgentLease("a", LIMITS, {}, ttl=ttl)
    call = lease.begin(1, at)
    lease.answered(call, Grant(admissions=[ADMITTED], extra=allowance, estimate=0.5))
    return lease


def asked(i: int) -> Ask:
    return Ask(f"r{i}", 1000.0, 1060.0)


def test_an_allowance_admits_until_used_up_or_its_time_is_nearly_gone() -> None:
    lease = lease_with(2)
    assert lease.take(asked(1), 1000.1)
    assert lease.take(asked(2), 1000.1)
    assert not lease.take(asked(3), 1000.1)  # used up
    assert [(h.request_id, h.estimate) for h in lease.held] == [("r1", 0.5), ("r2", 0.5)]
    late = lease_with(5)
    assert not late.take(asked(1), 1000.0 + 1.0 - MARGIN)  # expiring: Postgres decides


def test_half_an_allowance_used_or_half_its_time_gone_asks_for_more() -> None:
    lease = lease_with(8)
    for i in range(3):
        lease.take(asked(i), 1000.1)
    assert not lease.low(1000.1)
    lease.take(asked(3), 1000.1)
    assert lease.low(1000.1)  # 4 of 8 left
    assert lease_with(8).low(1000.5)  # half of its second gone


def test_a_busy_replica_asks_for_its_rate_a_quiet_one_keeps_an_idle_one_gives_back(
) -> None:
    busy = lease_with(100)
    for i in range(50):
        busy.take(asked(i), 1000.25)
    call = busy.begin(0, 1000.25)
    # 50 admitted in 0.25 s: 200 a second, 200 for the next second, 50 still held.
    assert (len(call.held), call.keep, call.want) == (50, 50, 150)
    assert busy.held == []
    quiet = lease_with(100)  # nothing asked for half a second: renewed, nothing more
    call = quiet.begin(0, 1000.5)
    assert (call.keep, call.want) == (100, 0)
    idle = lease_with(100)  # nothing asked for IDLE_LEASES periods: given back
    call = idle.begin(0, 1000.0 + IDLE_LEASES * 1.0)
    assert (call.held, call.keep, call.want, idle.allowance) == ([], 0, 0, 0)


def test_admissions_of_a_call_that_failed_are_recorded_by_the_next() -> None:
    lease = lease_with(4)
    lease.take(asked(1), 1000.1)
    call = lease.begin(0, 1000.2)
    lease.take(asked(2), 1000.2)
    lease.failed(call)
    assert [h.request_id for h in lease.begin(0, 1000.3).held] == ["r1", "r2"]


class _GrantingLimits:
    """A limits store that admits every request asked about and grants `extra` more;
    records what each call recorded in flight."""

    def __init__(self, extra: int) -> None:
        self.extra = extra
        self.calls: list[dict[str, Any]] = []

    async def lease(self, agent_id: str, *, asks: Sequence[Ask], held: Sequence[Held],
                    keep: int, want: int, **_: Any) -> Grant:
        self.calls.append({"asks": [a.request_id for a in asks],
                           "held": [h.request_id for h in held], "keep": keep, "want": want})
        return Grant(admissions=[ADMITTED] * len(asks), extra=self.extra, estimate=0.0)


def envelope_of(request_id: str) -> Admitted:
    return Admitted(request=AgentRequest(request_id=request_id, session_id="s", query="q",
                                         agent_id="a"), accepted_at=100.0, deadline=220.0)


async def test_the_gate_admits_on_its_allowance_and_records_those_at_its_next_call() -> None:
    store = _GrantingLimits(extra=3)
    gate = LimitGate(store, FakePolicies({"a": apply("rate=2/s")}), DEFAULTS,
                     clock=lambda: 1000.0)
    for i in range(4):
        admission, _ = await gate.check(envelope_of(f"r{i}"))
        assert admission.verdict == Verdict.ADMIT
    # r0 asked Postgres (granted 3 more); r1, r2 and r3 used the allowance without a
    # call (r2 left it half used: a top-up started in the background, which records
    # the three in flight).
    assert len(store.calls) == 1
    await asyncio.sleep(0)
    assert store.calls[0] == {"asks": ["r0"], "held": [], "keep": 0, "want": MIN_WANT}
    assert [c["asks"] for c in store.calls] == [["r0"], []]
    assert store.calls[1]["held"] == ["r1", "r2", "r3"]
