"""Per-agent policy assignments: parsing, validation, round trip."""

from __future__ import annotations

import pytest

from shared.policy.agent import (
    AgentPolicy,
    ClarityPolicy,
    PolicyError,
    Price,
    apply_assignment,
    decode_policy,
    encode_policy,
)


def apply(*assignments: str) -> AgentPolicy:
    policy = AgentPolicy()
    for assignment in assignments:
        policy = apply_assignment(policy, assignment)
    return policy


def test_assignments_build_a_policy_that_round_trips() -> None:
    policy = apply("clarity_threshold=0.7", "clarity_policy=ask",
                   "fallback.main=qwen2.5:1.5b, qwen2.5:0.5b,error", "slo_p95_ms=450",
                   "price.qwen2.5:1.5b=0.1,0.2", "price.extractive=0,0,0.001")
    assert policy.clarity_threshold == 0.7
    assert policy.clarity_policy is ClarityPolicy.ASK
    assert policy.fallback == {"main": ["qwen2.5:1.5b", "qwen2.5:0.5b", "error"]}
    assert policy.slo_p95_ms == 450
    assert policy.prices["qwen2.5:1.5b"] == Price(0.1, 0.2, 0.0)
    assert policy.prices["extractive"].per_compute_s == 0.001
    assert decode_policy(encode_policy(policy)) == policy


def test_an_empty_value_unsets_a_key() -> None:
    policy = apply("clarity_threshold=0.7", "fallback.main=extractive", "price.m=1,2")
    cleared = apply_assignment(apply_assignment(apply_assignment(
        policy, "clarity_threshold="), "fallback.main="), "price.m=")
    assert cleared == AgentPolicy()
    assert encode_policy(cleared) == "{}"


@pytest.mark.parametrize("assignment", [
    "clarity_threshold=1.5", "clarity_threshold=nan", "clarity_threshold=high",
    "clarity_policy=maybe", "fallback.main=qwen", "fallback.main=extractive,qwen,error",
    "fallback.main=qwen,,error", "fallback.other=extractive", "price.m=1",
    "price.m=-1,2", "slo_p95_ms=-3", "colour=blue", "clarity_threshold", "=1",
])
def test_bad_assignments_are_refused_with_a_reason(assignment: str) -> None:
    with pytest.raises(PolicyError):
        apply(assignment)


def test_a_stored_policy_with_unknown_keys_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown field"):
        decode_policy('{"colour": "blue"}')


def test_the_prices_currency_is_a_three_letter_code() -> None:
    policy = apply("price.big=0.5,1.5", "currency=eur")
    assert policy.currency == "EUR"
    assert decode_policy(encode_policy(policy)) == policy
    assert apply("currency=EUR", "currency=").currency is None
    for bad in ("currency=euro", "currency=E1R", "currency=€"):
        with pytest.raises(PolicyError, match="currency"):
            apply(bad)


def test_an_unknown_key_is_refused_with_the_keys_listed() -> None:
    """Issue 31: `agent set NAME colour=blue` named the key only."""
    from shared.policy.agent import POLICY_KEYS, PolicyError, apply_assignment

    with pytest.raises(PolicyError) as refused:
        apply_assignment(AgentPolicy(), "colour=blue")
    assert str(refused.value) == ("unknown policy key 'colour'; the keys: "
                                  + ", ".join(POLICY_KEYS))
    for key in POLICY_KEYS:  # each key listed is one (an empty value unsets it)
        named = key.replace("SLOT", "main").replace("MODEL", "m")
        apply_assignment(AgentPolicy(), f"{named}=")


def test_a_named_model_is_one_the_policy_lists_and_the_fleet_serves() -> None:
    from shared.contracts.errors import UnknownModelError
    from shared.policy.chain import check_asked

    policy = AgentPolicy(models=["cloud/big-1", "cloud/gone"])
    check_asked("", AgentPolicy())  # no model named: the slot's
    check_asked("cloud/big-1", policy, served={"cloud/big-1"}.__contains__)
    for asked, served in (("cloud/small", None), ("cloud/gone", {"cloud/big-1"})):
        with pytest.raises(UnknownModelError) as refused:
            check_asked(asked, policy, served=served.__contains__ if served else None)
        assert (refused.value.code, refused.value.param) == ("UNKNOWN_MODEL", "model")
        assert asked in refused.value.message
