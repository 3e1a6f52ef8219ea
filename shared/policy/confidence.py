"""Agent confidence (ADR-0006): how well a model works for one agent on one query type.

Pure arithmetic, no I/O and no clock of its own: every function takes `now`, so tests
and the learning job control time. `shared.store.scores.refresh_scores` feeds it counts
read from the feedback table.

Per (agent, model, query type), with `s` successes out of `n` outcomes (explicit
feedback, else the implicit outcome the pipeline recorded), the latest observed `d`
days ago, and `g` the global rate of that (model, query type) over every agent:

    w     = decay ** d                       evidence weight (10% less per idle day)
    score = (w*s + k*g) / (w*n + k)          Beta-Binomial posterior mean, prior g
                                             worth k observations

So an agent with no evidence scores exactly `g`, one with much evidence scores close to
its own rate `s/n`, and an idle agent slides back toward `g` as `w` shrinks: a prior,
never a switch. The global rate has a weak prior of its own (`global_prior`, worth
`global_prior_weight` observations) so that a slice nobody has used yet is not 0 or 1:

    g = (S + w0*p0) / (N + w0)
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import NamedTuple

import msgspec

from shared.contracts.feedback import FeedbackOutcome

DAY_S = 86_400.0
GLOBAL_AGENT = "*"  # agent_scores.agent_id of the global rows


class ConfidenceParams(msgspec.Struct, frozen=True, kw_only=True):
    # k: how many observations the global rate is worth in an agent's estimate.
    prior_strength: float = 10.0
    # Share of an agent's evidence kept per idle day (ADR-0006: it loses 10% a day).
    daily_decay: float = 0.9
    # |score - global| beyond this is flagged and logged for review.
    divergence_bound: float = 0.2
    # The global rate before any observation, and what it is worth (Laplace: 0.5, 2).
    global_prior: float = 0.5
    global_prior_weight: float = 2.0


def success_value(outcome: str) -> float:
    """What one outcome contributes to `s`: 1 for success, 0 for anything else (a
    fallback answer is a degraded one from the agent's side; it may say otherwise with
    explicit feedback)."""
    return 1.0 if outcome == FeedbackOutcome.SUCCESS else 0.0


def global_rate(successes: float, trials: float, params: ConfidenceParams) -> float:
    return (successes + params.global_prior_weight * params.global_prior) / (
        trials + params.global_prior_weight)


def idle_days(last_seen: datetime | None, now: datetime) -> float:
    """Days (fractional) since the last observation; 0 if none or in the future."""
    if last_seen is None:
        return 0.0
    return max(0.0, (now - last_seen).total_seconds() / DAY_S)


def evidence_weight(days_idle: float, params: ConfidenceParams) -> float:
    return float(params.daily_decay ** max(0.0, days_idle))


def shrunk_score(
    successes: float, trials: float, global_score: float, *, weight: float,
    params: ConfidenceParams,
) -> float:
    """The formula of the module doc; with neither evidence nor prior, the global rate."""
    k = params.prior_strength
    denominator = weight * trials + k
    if denominator <= 0:
        return global_score
    return (weight * successes + k * global_score) / denominator


class Estimate(NamedTuple):
    score: float
    # score - global rate (signed): what the dashboard shows and the bound is checked on.
    divergence: float
    diverged: bool
    # The evidence weight applied (1.0: observed just now).
    weight: float


def estimate(
    successes: float,
    trials: float,
    last_seen: datetime | None,
    global_score: float,
    now: datetime,
    params: ConfidenceParams,
) -> Estimate:
    """An agent slice's score at `now`, and whether it diverges from the global rate."""
    weight = evidence_weight(idle_days(last_seen, now), params)
    score = shrunk_score(successes, trials, global_score, weight=weight, params=params)
    divergence = score - global_score
    # A hair of tolerance: a score exactly on the bound is not beyond it.
    diverged = abs(divergence) > params.divergence_bound + 1e-12
    return Estimate(score, divergence, diverged, weight)


def half_life_days(params: ConfidenceParams) -> float:
    """Idle days after which an agent's evidence counts half (0.9/day: ~6.6 days)."""
    if not 0 < params.daily_decay < 1:
        return math.inf
    return math.log(0.5) / math.log(params.daily_decay)
