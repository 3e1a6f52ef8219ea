"""The learning job's pure parts: A/B arms, the policy a request is served with, the
observe-mode replay arithmetic, chain ordering, the "not worse" verdict, settings."""

from __future__ import annotations

import pytest

from shared.contracts.routing import Clarity
from shared.learning.estimate import (
    SHRINK,
    Half,
    Tally,
    ab_verdict,
    best_threshold,
    propose_order,
    replay_threshold,
)
from shared.learning.proposals import parse_assignment
from shared.learning.settings import LearnSettings
from shared.policy.ab import apply_proposal, effective_policy, in_ab_arm
from shared.policy.agent import AgentPolicy, PolicyError
from shared.policy.clarity import asks, clarity


def test_arm_assignment_is_deterministic_and_about_the_share() -> None:
    ids = [f"r{i}" for i in range(50_000)]
    arm = [in_ab_arm("ide", rid, 0.1) for rid in ids]
    assert arm == [in_ab_arm("ide", rid, 0.1) for rid in ids]
    assert sum(arm) / len(ids) == pytest.approx(0.1, abs=0.005)
    # Another agent's requests with the same ids fall into other arms.
    other = [in_ab_arm("chat", rid, 0.1) for rid in ids]
    assert sum(a and b for a, b in zip(arm, other, strict=True)) < 0.02 * len(ids)
    # A larger share keeps every request of the smaller one in the arm.
    assert all(in_ab_arm("ide", rid, 0.2) for rid, a in zip(ids, arm, strict=True) if a)


def test_the_arm_gets_the_candidate_and_the_rest_the_base() -> None:
    base = AgentPolicy(clarity_threshold=0.65)
    candidate = apply_proposal(base, "clarity_threshold", 0.4)
    ids = [f"r{i}" for i in range(2000)]
    served = {rid: effective_policy(base, candidate, "ide", rid, 0.1) for rid in ids}
    for rid, policy in served.items():
        assert policy == (candidate if in_ab_arm("ide", rid, 0.1) else base)
    assert all(effective_policy(base, None, "ide", rid, 0.1) is base for rid in ids)


def test_proposals_apply_through_the_policy_parser() -> None:
    chain = apply_proposal(AgentPolicy(), "fallback.main", ["a", "b", "error"])
    assert chain.fallback == {"main": ["a", "b", "error"]}
    assert parse_assignment("fallback.conversational=x,extractive") == (
        "fallback.conversational", ["x", "extractive"])
    assert parse_assignment("clarity_threshold=0.55") == ("clarity_threshold", 0.55)
    with pytest.raises(PolicyError):
        parse_assignment("clarity_threshold=1.5")
    with pytest.raises(PolicyError):
        parse_assignment("price.m=1,2")
    with pytest.raises(PolicyError):
        parse_assignment("fallback.main=a,b")  # no end step


def test_the_gate_asks_below_the_threshold_under_the_ask_policy_only() -> None:
    assert clarity(0.6, confirm=0.65) is Clarity.NEEDS_CLARIFICATION
    assert clarity(0.7, confirm=0.65) is Clarity.NEEDS_CONFIRMATION
    assert clarity(0.9) is Clarity.CLEAR
    assert asks(Clarity.NEEDS_CLARIFICATION, "ask")
    assert not asks(Clarity.NEEDS_CLARIFICATION, "proceed")
    assert not asks(Clarity.NEEDS_CONFIRMATION, "ask")


def _half(cells: dict[tuple[int, bool], tuple[float, float]]) -> Half:
    half = Half()
    for (b, asked), (n, v) in cells.items():
        half.gate(b, asked).add(n, v)
    return half


def test_replay_keeps_observed_values_and_estimates_changed_decisions() -> None:
    # Asked at 0.50-0.54 (100 decisions, 40 successes), answered at 0.70 (100, 80).
    agent = _half({(50, True): (100, 40), (70, False): (100, 80)})
    # Everyone's answers at 0.50-0.54: 60% successes over 200.
    pooled = _half({(50, True): (100, 40), (70, False): (100, 80), (52, False): (200, 120)})
    same = replay_threshold(agent, pooled, 0.65, ask_value=0.5)
    assert same is not None
    assert same.rate == pytest.approx(120 / 200)
    assert same.changed == 0
    # Answering at 0.50: the agent has no answers there, so everyone's 60%.
    lower = replay_threshold(agent, pooled, 0.45, ask_value=0.5)
    assert lower is not None
    assert lower.rate == pytest.approx((100 * 0.6 + 80) / 200)
    assert lower.changed == 100
    # Asking at 0.70 too: the agent's questions were worth 40/100, shrunk toward 0.5.
    higher = replay_threshold(agent, pooled, 0.75, ask_value=0.5)
    assert higher is not None
    ask_rate = (40 + SHRINK * 0.5) / (100 + SHRINK)
    assert higher.rate == pytest.approx((40 + 100 * ask_rate) / 200)
    # Under `proceed` nothing is asked, whatever the threshold.
    never = replay_threshold(agent, pooled, 0.75, ask_value=0.5, ask_policy=False)
    assert never is not None
    assert never.changed == 100


def test_replay_refuses_to_guess_without_evidence() -> None:
    agent = _half({(40, True): (100, 40), (70, False): (100, 80)})
    assert replay_threshold(agent, agent, 0.35, ask_value=0.5) is None
    choice = best_threshold(agent, agent, 0.65, ask_value=0.5)
    assert choice is not None
    assert choice.threshold >= 0.45  # nothing below 0.45 has evidence


def test_fallback_order_ranks_models_by_the_agents_success() -> None:
    agent, pooled = Half(), Half()
    agent.model("main", "small").add(200, 120)
    agent.model("main", "big").add(200, 180)
    agent.model("main", "rare").add(5, 5)
    pooled.model("main", "small").add(400, 240)
    pooled.model("main", "big").add(400, 360)
    pooled.model("main", "rare").add(5, 5)
    order = propose_order(["small", "rare", "big", "error"], agent, pooled, "main",
                          min_requests=50)
    assert order == ["big", "small", "rare", "error"]
    # No chain of its own: the end is the extractive answer.
    assert propose_order(None, agent, pooled, "main", min_requests=50) == [
        "big", "small", "rare", "extractive"]


@pytest.mark.parametrize(("arm", "control", "promote"), [
    ((300, 180), (3000, 1800), True),  # equal
    ((300, 200), (3000, 1800), True),  # better
    ((300, 177), (3000, 1800), True),  # 1 point worse: within the margin
    ((300, 165), (3000, 1800), False),  # 5 points worse
    ((200_000, 118_000), (2_000_000, 1_200_000), False),  # 1 point, but surely worse
])
def test_not_worse_is_within_the_margin_and_not_significantly_worse(
    arm: tuple[float, float], control: tuple[float, float], promote: bool,
) -> None:
    verdict = ab_verdict(Tally(*arm), Tally(*control), margin=0.02)
    assert verdict.promote is promote, verdict.reason


def test_learn_settings_read_the_environment() -> None:
    settings = LearnSettings.from_env({"LEARN_INTERVAL": "600", "LEARN_AB_SHARE": "0.2",
                                       "LEARN_AB_MIN_REQUESTS": "50"})
    assert (settings.interval, settings.ab_share, settings.ab_min_requests) == (600, 0.2, 50)
    assert LearnSettings.from_env({}).interval == 0  # off unless asked for
    with pytest.raises(ValueError, match="LEARN_AB_SHARE"):
        LearnSettings.from_env({"LEARN_AB_SHARE": "1.5"})
