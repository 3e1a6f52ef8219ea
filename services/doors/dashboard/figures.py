"""What the dashboard shows, computed from the rows `queries` reads (pure).

Every figure is per agent over a window of UTC days; per-day series are lists aligned
with `Dashboard.days`. A day's latency percentiles are the agent's exact ones for that
day (`daily_agent_latency`, as `intentroute report slo` reads them) or, where there is
none, the request-weighted means of the day's rollup rows' percentiles (percentiles do
not add up); the window's are the request-weighted means of the days'. A day breaches
the agent's SLO when its p95 exceeds the policy's `slo_p95_ms`.

Requests refused at admission (RATE_LIMITED, CONCURRENCY_LIMITED, QUOTA_EXCEEDED,
BUDGET_EXCEEDED) are counted apart, by code: they are among `requests` but not among
`errors`, and the rates (errors, fallbacks) are over the requests admitted. Costs are in
the agent's `currency` (its policy; "" = plain cost units). `scores` are the agent's
confidence scores beside the global rate, with the divergence the score refresh stored
(`diverged`: beyond CONFIDENCE_DIVERGENCE)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator
from typing import Protocol, TypeVar

import msgspec

from services.doors.dashboard.queries import Figures
from services.doors.dashboard.rows import (
    PER_DAY,
    PER_DAY_LAYER,
    PER_DAY_MODEL,
    PER_DAY_TYPE,
    PER_MODEL,
    AgentDayLatency,
    FeedbackGroup,
    OutcomeGroup,
    RollupGroup,
    ScoreRow,
    Window,
)
from shared.accounting.costs import ERROR_PREFIX, REFUSALS
from shared.contracts.feedback import FeedbackOutcome
from shared.contracts.routing import QueryType
from shared.policy.agent import AgentPolicy


class Totals(msgspec.Struct, kw_only=True):
    requests: int = 0
    # Refused at admission (among requests), and the other errors.
    refused: int = 0
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


class ScoreFigure(msgspec.Struct, kw_only=True):
    model: str
    query_type: str
    trials: float
    score: float
    global_score: float | None
    divergence: float | None
    diverged: bool


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
    # Refusals per code, per day.
    refused: dict[str, list[int]] = {}


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
    currency: str = ""
    refused: dict[str, int] = {}
    # Errors other than refusals, by code, most frequent first.
    errors_by_code: dict[str, int] = {}
    scores: list[ScoreFigure] = []
    diverged: int = 0
    # The window's first day with any of the agent's traffic, feedback or refusals (the
    # charts start there: a month's window with a day of data is not an empty grid with
    # one bar at its edge); None without any.
    first_day: str | None = None


def first_active_day(figures: AgentFigures) -> int | None:
    """The index of the first day of the window with any figure of the agent's."""
    daily = figures.daily
    series = [daily.requests, *daily.feedback.values(), *daily.refused.values()]
    return next((i for i in range(len(daily.requests)) if any(s[i] for s in series)), None)


class Dashboard(msgspec.Struct, kw_only=True):
    since: str
    until: str
    days: list[str]
    agents: list[AgentFigures]
    # When the database was read (UTC, ISO 8601), and the days read from the request log
    # (not rolled up yet); the other days are final rollups.
    as_of: str | None = None
    live_days: list[str] = []


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
        self.refused: dict[str, list[int]] = {}
        self.errors_by_code: dict[str, int] = {}
        self.scores: list[ScoreFigure] = []

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

    def add_outcome(self, index: int, group: OutcomeGroup) -> None:
        code = group.outcome.removeprefix(ERROR_PREFIX)
        if code in REFUSALS:
            self.series(self.refused, code)[index] += group.requests
        else:
            self.errors_by_code[code] = self.errors_by_code.get(code, 0) + group.requests

    def add_score(self, row: ScoreRow) -> None:
        self.scores.append(ScoreFigure(
            model=row.model, query_type=row.query_type, trials=row.trials, score=row.score,
            global_score=row.global_score, divergence=row.divergence, diverged=row.diverged))

    def add_day_group(self, index: int, g: RollupGroup) -> None:
        if g.grp == PER_DAY:
            self.per_day[index] = g
        elif g.grp == PER_DAY_TYPE:
            self.series(self.by_type, g.query_type or "")[index] += g.requests
        elif g.grp == PER_DAY_LAYER:
            self.series(self.by_layer, g.layer or "")[index] += g.requests
        elif g.grp == PER_DAY_MODEL:
            self.add_model(g)

    def add_model(self, group: RollupGroup) -> None:
        m = self.models.setdefault(group.model or "", ModelTotals())
        m.requests += group.requests
        m.tokens_in += group.tokens_in
        m.tokens_out += group.tokens_out
        m.cost += group.cost

    def freeze(self, slo: float | None, currency: str = "") -> AgentFigures:
        totals = Totals()
        refused_per_day = [sum(day) for day in zip(*self.refused.values(), strict=True)
                           ] or [0] * self.n
        p50_sum = p95_sum = 0.0
        p50_n = p95_n = 0
        daily = Daily(requests=[], errors=[], fallbacks=[], fallback_rate=[], cost=[],
                      p50_ms=[], p95_ms=[], breach=[], by_type={}, by_layer={}, feedback={})
        for day, exact, refused in zip(self.per_day, self.exact, refused_per_day,
                                       strict=True):
            g = day or RollupGroup(agent_id=self.agent_id, grp=PER_DAY)
            errors = max(0, g.errors - refused)
            admitted = max(0, g.requests - refused)
            totals.requests += g.requests
            totals.refused += refused
            totals.errors += errors
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
            daily.errors.append(errors)
            daily.fallbacks.append(g.fallbacks)
            daily.fallback_rate.append(_rate(g.fallbacks, admitted))
            daily.cost.append(g.cost)
            daily.p50_ms.append(day_p50)
            daily.p95_ms.append(day_p95)
            daily.breach.append(slo is not None and day_p95 is not None and day_p95 > slo)
        admitted = totals.requests - totals.refused
        totals.fallback_rate = _rate(totals.fallbacks, admitted)
        totals.error_rate = _rate(totals.errors, admitted)
        daily.refused = {code: self.refused[code] for code in REFUSALS if code in self.refused}
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
            currency=currency,
            refused={code: sum(v) for code, v in daily.refused.items()},
            errors_by_code=dict(sorted(self.errors_by_code.items(), key=lambda kv: -kv[1])),
            scores=sorted(self.scores, key=lambda s: (-abs(s.divergence or 0.0), s.model,
                                                      s.query_type)),
            diverged=sum(s.diverged for s in self.scores),
        )


class _Dated(Protocol):
    @property
    def agent_id(self) -> str: ...
    @property
    def day(self) -> dt.date | None: ...


_Row = TypeVar("_Row", bound=_Dated)


def _in_window(rows: Iterable[_Row], index: dict[dt.date, int]) -> Iterator[tuple[int, _Row]]:
    """Each row of a day of the window, with the day's index."""
    for row in rows:
        i = index.get(row.day) if row.day is not None else None
        if i is not None:
            yield i, row


def build_dashboard(window: Window, figures: Figures) -> Dashboard:
    days = window.days()
    index = {day: i for i, day in enumerate(days)}
    agents: dict[str, _Agent] = {}

    def agent(agent_id: str) -> _Agent:
        if agent_id not in agents:
            agents[agent_id] = _Agent(agent_id, len(days))
        return agents[agent_id]

    for g in figures.rollups:  # over the window (no day)
        if g.grp == PER_MODEL:
            agent(g.agent_id).add_model(g)
    for i, g in _in_window(figures.rollups, index):
        agent(g.agent_id).add_day_group(i, g)
    for i, lat in _in_window(figures.latency, index):
        agent(lat.agent_id).exact[i] = lat
    for i, f in _in_window(figures.feedback, index):
        agent(f.agent_id).add_feedback(i, f)
    for i, o in _in_window(figures.outcomes, index):
        agent(o.agent_id).add_outcome(i, o)
    for score in figures.scores:
        if score.agent_id in agents:  # agents with traffic or feedback in the window
            agents[score.agent_id].add_score(score)
    result = []
    for agent_id in sorted(agents):
        policy = figures.policies.get(agent_id) or AgentPolicy()
        frozen = agents[agent_id].freeze(policy.slo_p95_ms, policy.currency or "")
        first = first_active_day(frozen)
        frozen.first_day = days[first].isoformat() if first is not None else None
        result.append(frozen)
    return Dashboard(since=window.since.isoformat(), until=window.until.isoformat(),
                     days=[d.isoformat() for d in days], agents=result,
                     as_of=figures.as_of.isoformat() if figures.as_of else None,
                     live_days=[d.isoformat() for d in figures.live_days])
