"""Agent confidence arithmetic (shared/policy/confidence.py) on a clock the test controls, and the
implicit outcome of a request-log row (shared/store/writer.py)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from shared.contracts.feedback import FeedbackOutcome
from shared.policy.confidence import (
    ConfidenceParams,
    estimate,
    evidence_weight,
    global_rate,
    half_life_days,
    idle_days,
    shrunk_score,
    success_value,
)
from shared.store.rows import RequestLogRow
from shared.store.writer import implicit_outcome
from testkit.clocks import ManualUtcClock

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
P = ConfidenceParams(prior_strength=10.0, daily_decay=0.9, divergence_bound=0.2)


def test_an_agent_without_evidence_scores_the_global_rate() -> None:
    assert estimate(0, 0, None, 0.73, T0, P).score == pytest.approx(0.73, abs=0)


def test_shrinkage_is_a_prior_worth_k_observations() -> None:
    # 8 of 10 with a global 0.5 and k = 10: (8 + 5) / (10 + 10) exactly.
    assert shrunk_score(8, 10, 0.5, weight=1.0, params=P) == 13 / 20
    # The more evidence, the nearer its own rate: 80 of 100 -> (80 + 5) / 110.
    assert shrunk_score(80, 100, 0.5, weight=1.0, params=P) == 85 / 110
    # A stronger prior pulls harder: k = 40 -> (8 + 20) / 50.
    strong = ConfidenceParams(prior_strength=40.0)
    assert shrunk_score(8, 10, 0.5, weight=1.0, params=strong) == 28 / 50
    # No prior at all: the agent's own rate.
    assert shrunk_score(8, 10, 0.5, weight=1.0, params=ConfidenceParams(prior_strength=0)) == 0.8
    assert shrunk_score(0, 0, 0.5, weight=1.0, params=ConfidenceParams(prior_strength=0)) == 0.5


def test_idle_evidence_loses_ten_percent_a_day_toward_the_global_rate() -> None:
    clock = ManualUtcClock(T0)
    seen = T0
    scores = []
    for days in range(4):
        est = estimate(20, 20, seen, 0.5, clock.now, P)
        assert est.weight == pytest.approx(0.9 ** days, rel=1e-15)
        w = 0.9 ** days
        assert est.score == pytest.approx((20 * w + 5) / (20 * w + 10), rel=1e-15)
        scores.append(est.score)
        clock.advance(days=1)
    # Monotonically back toward 0.5, never past it.
    assert scores == sorted(scores, reverse=True)
    assert all(s > 0.5 for s in scores)
    # Half the weight after log(0.5)/log(0.9) idle days (~6.58), and fractional days count.
    half = half_life_days(P)
    assert half == pytest.approx(6.578813478960585)
    assert estimate(20, 20, seen, 0.5, T0 + timedelta(days=half), P).weight == pytest.approx(0.5)
    assert idle_days(seen, T0 + timedelta(hours=6)) == 0.25
    assert evidence_weight(0.25, P) == 0.9 ** 0.25
    # A year idle: the global rate, to within the evidence left.
    assert estimate(20, 20, seen, 0.5, T0 + timedelta(days=365), P).score == pytest.approx(
        0.5, abs=1e-15)


def test_a_last_observation_in_the_future_is_not_negative_idleness() -> None:
    assert idle_days(T0 + timedelta(hours=1), T0) == 0.0
    assert estimate(1, 1, T0 + timedelta(hours=1), 0.5, T0, P).weight == 1.0


def test_global_rate_has_a_laplace_prior() -> None:
    assert global_rate(0, 0, P) == 0.5
    assert global_rate(3, 4, P) == 4 / 6
    assert global_rate(9, 10, ConfidenceParams(global_prior=0.8, global_prior_weight=5)) == 13 / 15


def test_divergence_is_flagged_beyond_the_bound_only() -> None:
    # 0 of 30 against a global 0.9: (0 + 9) / 40 = 0.225, divergence -0.675.
    low = estimate(0, 30, T0, 0.9, T0, P)
    assert low.score == 9 / 40
    assert low.divergence == pytest.approx(9 / 40 - 0.9)
    assert low.diverged
    # Few observations are shrunk inside the bound: 0 of 2 -> 9 / 12 = 0.75 (-0.15).
    few = estimate(0, 2, T0, 0.9, T0, P)
    assert few.score == 9 / 12
    assert not few.diverged
    # Exactly on the bound is not beyond it: 2 of 10 vs 0.6 -> (2 + 6) / 20 = 0.4 (-0.2).
    on = estimate(2, 10, T0, 0.6, T0, P)
    assert math.isclose(on.divergence, -0.2)
    assert not on.diverged
    # Idleness brings a diverged agent back within the bound.
    later = estimate(0, 30, T0, 0.9, T0 + timedelta(days=30), P)
    assert not later.diverged


def test_only_success_counts_as_a_success() -> None:
    assert success_value(FeedbackOutcome.SUCCESS) == 1.0
    for outcome in ("fallback", "timeout", "error", "user_rejected"):
        assert success_value(outcome) == 0.0


def _row(outcome: str, **fields: object) -> RequestLogRow:
    return RequestLogRow(request_id="r", agent_id="a", session_id="s", outcome=outcome,
                         **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("row", "expected"), [
    (_row("ok"), FeedbackOutcome.SUCCESS),
    (_row("ok", validation_status="PARSER_UNAVAILABLE"), FeedbackOutcome.SUCCESS),
    (_row("ok", fallback=True, fallback_reason="timeout"), FeedbackOutcome.FALLBACK),
    (_row("ok", validation_status="INVALID_UNRESOLVED"), FeedbackOutcome.ERROR),
    (_row("error:DEADLINE_EXCEEDED"), FeedbackOutcome.TIMEOUT),
    (_row("error:STAGE_FAILED"), FeedbackOutcome.ERROR),
    (_row("error:RC04_VIOLATION"), FeedbackOutcome.ERROR),
    # The caller's own bad input says nothing about how well it is served.
    (_row("error:MALFORMED_JSON"), None),
    (_row("error:UNKNOWN_QUERY_TYPE"), None),
    (_row("error:AGENT_MISMATCH"), None),
    (_row("error:UNKNOWN_AGENT"), None),
    # A clarification question answered nothing.
    (_row("clarification"), None),
])
def test_the_implicit_outcome_of_a_request_log_row(
    row: RequestLogRow, expected: FeedbackOutcome | None
) -> None:
    assert implicit_outcome(row) == expected
