"""What the dashboard shows, computed from the rows `queries` reads (pure).

Every figure is per agent over a window of UTC days; per-day series are lists aligned
with `Dashboard.days`. A day's latency percentiles are the agent's exact ones for that
day (`daily_agent_latency`, as `intentroute report slo` reads them) or, where there is
none, the request-weighted means of the day's rollup rows' percentiles (percentiles do
not add up); the window's are the request-weighted means of the days'. A day breaches
the agent's SLO when its p95 exceeds the policy's `slo_p95_ms`."""

from __future__ import annotations

import msgspec

from services.gateway.dashboard.queries import (
    PER_DAY,
    PER_DAY_LAYER,
    PER_DAY_TYPE,
    PER_MODEL,
    AgentDayLatency,
    FeedbackGroup,
    Figures,
    RollupGroup,
    Window,
)
from shared.contracts.feedback import FeedbackOutcome
from shared.contracts.routing import QueryType


class Totals(msgspec.Struct, kw_only=True):
    requests: int = 0
    errors: int = 0
    fallbacks: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    compute_s: float = 0.0
    cost: float = 0.0
    fallback_rate: float | None = None
    error_rate: float | None = None
    p50_ms: float | None = None
    p95_ms: float | None = None


class ModelTotals(msgspec.Struct, kw_only=True):
    requests: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0


class FeedbackTotals(msgspec.Struct, kw_only=True):
    total: int = 0
    explicit: int = 0
    implicit: int = 0
    outcomes: dict[str, int] = {}
    quality_mean: float | None = None


class Daily(msgspec.Struct, kw_only=True):
    requests: list[int]
    errors: list[int]
    fallbacks: list[int]
    fallback_rate: list[float | None]
    cost: list[float]
    p50_ms: list[float | None]
    p95_ms: list[float | None]
    breach: list[bool]
    by_type: dict[str, list[int]]
    by_layer: dict[str, list[int]]
    feedback: dict[str, list[int]]


class AgentFigures(msgspec.Struct, kw_only=True):
    agent_id: str
    slo_p95_ms: float | None
    slo_breaches: int
    totals: Totals
    by_type: dict[str, int]
    by_layer: dict[str, int]
    by_model: dict[str, ModelTotals]
    feedback: FeedbackTotals
    daily: Daily


class Dashboard(msgspec.Struct, kw_only=True):
    since: str
    until: str
    days: list[str]
    agents: list[AgentFigures]


def _rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _mean(total: float, weight: int) -> float | None:
    return total / weight if weight else None


def _ordered(keys: set[str], known: list[str]) -> list[str]:
    """The known vocabulary's order first, then anything else alphabetically."""
    return [k for k in known if k in keys] + sorted(keys - set(known))


class _Agent:
    """Accumulates one agent's groups, then freezes them into AgentFigures."""

    def __init__(self, agent_id: str, n_days: int) -> None:
        self.agent_id = agent_id
        self.n = n_days
        self.per_day: list[RollupGroup | None] = [None] * n_days
        self.exact: list[AgentDayLatency | None] = [None] * n_days
        self.by_type: dict[str, list[int]] = {}
        self.by_layer: dict[str, list[int]] = {}
        self.models: dict[str, ModelTotals] = {}
        self.feedback: dict[str, list[int]] = {}
        self.feedback_totals = FeedbackTotals(outcomes={})
        self.quality_sum = 0.0
        self.quality_n = 0

    def series(self, table: dict[str, list[int]], key: str) -> list[int]:
        return table.setdefault(key, [0] * self.n)

    def add_feedback(self, index: int, group: FeedbackGroup) -> None:
        self.series(self.feedback, group.outcome)[index] += group.n
        totals = self.feedback_totals
        totals.total += group.n
        totals.outcomes[group.outcome] = totals.outcomes.get(group.outcome, 0) + group.n
        totals.explicit += group.explicit
        totals.implicit += group.implicit
        self.quality_sum += group.quality_sum
        self.quality_n += group.quality_n

    def freeze(self, slo: float | None) -> AgentFigures:
        totals = Totals()
        p50_sum = p95_sum = 0.0
        p50_n = p95_n = 0
        daily = Daily(requests=[], errors=[], fallbacks=[], fallback_rate=[], cost=[],
                      p50_ms=[], p95_ms=[], breach=[], by_type={}, by_layer={}, feedback={})
        for day, exact in zip(self.per_day, self.exact, strict=True):
            g = day or RollupGroup(agent_id=self.agent_id, grp=PER_DAY)
            totals.requests += g.requests
            totals.errors += g.errors
            totals.fallbacks += g.fallbacks
            totals.tokens_in += g.tokens_in
            totals.tokens_out += g.tokens_out
            totals.compute_s += g.compute_s
            totals.cost += g.cost
            if exact is not None:  # the day's exact percentiles replace the estimate
                day_p50, day_p95 = exact.p50_ms, exact.p95_ms
                p50_sum += (day_p50 or 0.0) * exact.requests
                p50_n += exact.requests if day_p50 is not None else 0
                p95_sum += (day_p95 or 0.0) * exact.requests
                p95_n += exact.requests if day_p95 is not None else 0
            else:
                day_p50, day_p95 = _mean(g.p50_sum, g.p50_n), _mean(g.p95_sum, g.p95_n)
                p50_sum += g.p50_sum
                p50_n += g.p50_n
                p95_sum += g.p95_sum
                p95_n += g.p95_n
            daily.requests.append(g.requests)
            daily.errors.append(g.errors)
            daily.fallbacks.append(g.fallbacks)
            daily.fallback_rate.append(_rate(g.fallbacks, g.requests))
            daily.cost.append(g.cost)
            daily.p50_ms.append(day_p50)
            daily.p95_ms.append(day_p95)
            daily.breach.append(slo is not None and day_p95 is not None and day_p95 > slo)
        totals.fallback_rate = _rate(totals.fallbacks, totals.requests)
        totals.error_rate = _rate(totals.errors, totals.requests)
        totals.p50_ms = _mean(p50_sum, p50_n)
        totals.p95_ms = _mean(p95_sum, p95_n)
        daily.by_type = {k: self.by_type[k] for k in _ordered(set(self.by_type), list(QueryType))}
        daily.by_layer = {k: self.by_layer[k] for k in sorted(self.by_layer)}
        daily.feedback = {k: self.feedback[k]
                          for k in _ordered(set(self.feedback), list(FeedbackOutcome))}
        self.feedback_totals.outcomes = {k: self.feedback_totals.outcomes[k]
                                         for k in daily.feedback}
        self.feedback_totals.quality_mean = _mean(self.quality_sum, self.quality_n)
        return AgentFigures(
            agent_id=self.agent_id,
            slo_p95_ms=slo,
            slo_breaches=sum(daily.breach),
            totals=totals,
            by_type={k: sum(v) for k, v in daily.by_type.items()},
            by_layer={k: sum(v) for k, v in daily.by_layer.items()},
            by_model=dict(sorted(self.models.items())),
            feedback=self.feedback_totals,
            daily=daily,
        )


def build_dashboard(window: Window, figures: Figures) -> Dashboard:
    days = window.days()
    index = {day: i for i, day in enumerate(days)}
    agents: dict[str, _Agent] = {}

    def agent(agent_id: str) -> _Agent:
        if agent_id not in agents:
            agents[agent_id] = _Agent(agent_id, len(days))
        return agents[agent_id]

    for g in figures.rollups:
        if g.grp == PER_MODEL:
            agent(g.agent_id).models[g.model or ""] = ModelTotals(
                requests=g.requests, tokens_in=g.tokens_in, tokens_out=g.tokens_out,
                cost=g.cost)
            continue
        i = index.get(g.day) if g.day is not None else None
        if i is None:
            continue
        a = agent(g.agent_id)
        if g.grp == PER_DAY:
            a.per_day[i] = g
        elif g.grp == PER_DAY_TYPE:
            a.series(a.by_type, g.query_type or "")[i] += g.requests
        elif g.grp == PER_DAY_LAYER:
            a.series(a.by_layer, g.layer or "")[i] += g.requests
    for lat in figures.latency:
        i = index.get(lat.day)
        if i is not None:
            agent(lat.agent_id).exact[i] = lat
    for f in figures.feedback:
        i = index.get(f.day)
        if i is not None:
            agent(f.agent_id).add_feedback(i, f)
    result = []
    for agent_id in sorted(agents):
        policy = figures.policies.get(agent_id)
        result.append(agents[agent_id].freeze(policy.slo_p95_ms if policy else None))
    return Dashboard(since=window.since.isoformat(), until=window.until.isoformat(),
                     days=[d.isoformat() for d in days], agents=result)
