"""The dashboard's figures from rollup, log, outcome, score and feedback groups (no
database), its shared stage readings, and its session cookie."""

from __future__ import annotations

import datetime as dt

import pytest

from services.doors.dashboard.auth import session_cookie, session_valid, token_matches
from services.doors.dashboard.figures import build_dashboard
from services.doors.dashboard.queries import Figures
from services.doors.dashboard.rows import (
    PER_DAY,
    PER_DAY_LAYER,
    PER_DAY_MODEL,
    PER_DAY_TYPE,
    PER_MODEL,
    FeedbackGroup,
    RollupGroup,
    Window,
)
from services.doors.dashboard.settings import DashboardSettings
from shared.auth.identity import bearer_value
from shared.policy.agent import AgentPolicy

D1, D2, D3 = dt.date(2026, 3, 1), dt.date(2026, 3, 2), dt.date(2026, 3, 3)
WINDOW = Window(D1, D3)


def day(agent: str, d: dt.date, requests: int, *, p95: tuple[float, int] = (0.0, 0),
        fallbacks: int = 0, cost: float = 0.0) -> RollupGroup:
    return RollupGroup(agent_id=agent, day=d, grp=PER_DAY, requests=requests,
                       fallbacks=fallbacks, cost=cost, p95_sum=p95[0], p95_n=p95[1])


def test_a_day_breaches_when_its_request_weighted_p95_exceeds_the_slo() -> None:
    figures = Figures(
        rollups=[
            # (100 ms x 90 requests + 300 ms x 10) / 100 = 120 ms > 110: breach
            day("ide", D1, 100, p95=(100 * 90 + 300 * 10, 100)),
            day("ide", D3, 50, p95=(100.0 * 50, 50)),  # 100 ms: no breach
        ],
        feedback=[], policies={"ide": AgentPolicy(slo_p95_ms=110.0)})
    [ide] = build_dashboard(WINDOW, figures).agents
    assert ide.daily.p95_ms == [120.0, None, 100.0]
    assert ide.daily.breach == [True, False, False]
    assert ide.slo_breaches == 1
    assert ide.totals.p95_ms == (100 * 90 + 300 * 10 + 100 * 50) / 150


def test_no_slo_no_breach_and_days_without_traffic_are_zero() -> None:
    figures = Figures(rollups=[day("jobs", D2, 10, p95=(9e9, 10), fallbacks=2, cost=0.5)],
                      feedback=[], policies={})
    dash = build_dashboard(WINDOW, figures)
    assert dash.days == ["2026-03-01", "2026-03-02", "2026-03-03"]
    [jobs] = dash.agents
    assert jobs.slo_p95_ms is None
    assert jobs.slo_breaches == 0
    assert jobs.daily.requests == [0, 10, 0]
    assert jobs.daily.fallback_rate == [None, 0.2, None]
    assert jobs.daily.cost == [0.0, 0.5, 0.0]
    assert jobs.totals.fallback_rate == 0.2


def test_traffic_is_split_by_type_and_layer_and_models_are_totalled() -> None:
    figures = Figures(rollups=[
        day("a", D1, 7),
        RollupGroup(agent_id="a", day=D1, query_type="PLATFORM", grp=PER_DAY_TYPE, requests=3),
        RollupGroup(agent_id="a", day=D1, query_type="RETRIEVAL", grp=PER_DAY_TYPE,
                    requests=4),
        RollupGroup(agent_id="a", day=D1, layer="rules", grp=PER_DAY_LAYER, requests=7),
        RollupGroup(agent_id="a", model="extractive", grp=PER_MODEL, requests=7, cost=0.0),
        # outside the window: ignored
        RollupGroup(agent_id="a", day=dt.date(2026, 2, 1), query_type="PLATFORM",
                    grp=PER_DAY_TYPE, requests=99),
    ], feedback=[], policies={})
    [a] = build_dashboard(WINDOW, figures).agents
    assert list(a.daily.by_type) == ["RETRIEVAL", "PLATFORM"]  # QueryType order
    assert a.by_type == {"RETRIEVAL": 4, "PLATFORM": 3}
    assert a.daily.by_layer == {"rules": [7, 0, 0]}
    assert a.by_model["extractive"].requests == 7


def test_feedback_is_counted_per_outcome_source_and_day() -> None:
    figures = Figures(rollups=[], policies={}, feedback=[
        FeedbackGroup("chat", D1, "user_rejected", 2, 2, 0, 6.0, 2),
        FeedbackGroup("chat", D3, "success", 3, 3, 0, 27.0, 3),
        FeedbackGroup("chat", D3, "fallback", 4, 0, 4),
    ])
    [chat] = build_dashboard(WINDOW, figures).agents
    fb = chat.feedback
    assert (fb.total, fb.explicit, fb.implicit) == (9, 5, 4)
    assert fb.outcomes == {"success": 3, "fallback": 4, "user_rejected": 2}
    assert fb.quality_mean == 33.0 / 5
    assert chat.daily.feedback["success"] == [0, 0, 3]
    assert chat.totals.requests == 0  # feedback alone still lists the agent


def test_the_session_cookie_is_signed_with_the_token_and_expires() -> None:
    cookie = session_cookie("s3cret", now=1000.0, ttl=60.0)
    assert "s3cret" not in cookie
    assert session_valid("s3cret", cookie, now=1059.0)
    assert not session_valid("s3cret", cookie, now=1060.0)  # expired
    assert not session_valid("other", cookie, now=1001.0)  # token changed
    expires, _, signature = cookie.partition(".")
    assert not session_valid("s3cret", f"{int(expires) + 3600}.{signature}", now=1001.0)
    assert not session_valid("s3cret", "garbage", now=0.0)
    assert not session_valid("", cookie, now=1001.0)


def test_bearer_and_form_tokens_must_match_exactly() -> None:
    assert token_matches("tok", bearer_value("Bearer tok"))
    assert token_matches("tok", bearer_value("bearer  tok "))
    assert not token_matches("tok", bearer_value("Basic tok"))
    assert not token_matches("tok", bearer_value("Bearer to"))
    assert not token_matches("", "")  # no configured token: nothing matches
    assert token_matches("tok", "tok")
    assert not token_matches("tok", "TOK")


def test_dashboard_is_off_unless_a_token_is_set() -> None:
    assert DashboardSettings.from_env({}).token == ""
    assert DashboardSettings.from_env({"GATEWAY_DASHBOARD_TOKEN": "x"}).token == "x"


def test_a_days_exact_percentiles_replace_the_rollup_estimate() -> None:
    from services.doors.dashboard.rows import AgentDayLatency

    figures = Figures(
        rollups=[day("ide", D1, 100, p95=(90.0 * 100, 100)),  # estimate 90: no breach
                 day("ide", D2, 100, p95=(150.0 * 100, 100))],  # estimate 150: breach
        feedback=[], policies={"ide": AgentPolicy(slo_p95_ms=110.0)},
        latency=[AgentDayLatency("ide", D1, 100, 60.0, 130.0),  # exact 130: breach
                 AgentDayLatency("ide", D3, 300, None, None)])  # no figure: none shown
    [ide] = build_dashboard(WINDOW, figures).agents
    assert ide.daily.p95_ms == [130.0, 150.0, None]
    assert ide.daily.p50_ms[0] == 60.0
    assert ide.daily.breach == [True, True, False]
    assert ide.totals.p95_ms == (130.0 * 100 + 150.0 * 100) / 200


def log_row(agent: str, d: dt.date, model: str, query_type: str, layer: str, requests: int,
            *, errors: int = 0, cost: float = 0.0, p95: float | None = None,
            tokens: int = 0) -> dict[str, object]:
    """A row as `shared.accounting.rollups.ROLLUP_ROWS_SQL` returns it."""
    return {"day": d, "agent_id": agent, "model": model, "query_type": query_type,
            "layer": layer, "requests": requests, "errors": errors, "fallbacks": 0,
            "tokens_in": tokens, "tokens_out": tokens // 2, "compute_s": 0.0, "cost": cost,
            "latency_p50_ms": None if p95 is None else p95 / 2, "latency_p95_ms": p95,
            "latency_p99_ms": p95}


def test_days_read_from_the_log_give_the_groups_the_rollup_statements_would() -> None:
    from services.doors.dashboard.live import rollup_groups

    groups = rollup_groups([
        log_row("a", D3, "big", "RETRIEVAL", "embedding", 4, cost=0.25, p95=100.0, tokens=10),
        log_row("a", D3, "big", "PLATFORM", "rules", 6, errors=1, cost=0.5, p95=200.0),
        log_row("a", D3, "", "", "", 5, errors=5),  # refused: no decision, no model
    ])
    by = {(g.grp, g.query_type, g.layer, g.model): g for g in groups}
    day_group = by[(PER_DAY, None, None, None)]
    assert (day_group.requests, day_group.errors, day_group.cost) == (15, 6, 0.75)
    # percentiles weighted by requests, rows without one left out (as DAYS_SQL)
    assert (day_group.p95_sum, day_group.p95_n) == (4 * 100.0 + 6 * 200.0, 10)
    assert by[(PER_DAY_TYPE, "PLATFORM", None, None)].requests == 6
    assert by[(PER_DAY_LAYER, None, "", None)].requests == 5
    assert by[(PER_DAY_MODEL, None, None, "big")].cost == 0.75
    assert by[(PER_DAY_MODEL, None, None, "big")].tokens_in == 10
    # built into the figures, a live day counts like a rolled-up one
    [a] = build_dashboard(WINDOW, Figures(rollups=groups, feedback=[], policies={})).agents
    assert a.daily.requests == [0, 0, 15]
    assert a.by_type == {"RETRIEVAL": 4, "PLATFORM": 6, "": 5}


def test_refusals_are_counted_by_code_apart_from_errors_and_rates() -> None:
    from services.doors.dashboard.rows import OutcomeGroup

    figures = Figures(
        rollups=[RollupGroup(agent_id="a", day=D2, grp=PER_DAY, requests=20, errors=9,
                             fallbacks=2)],
        feedback=[], policies={},
        outcomes=[OutcomeGroup("a", D2, "error:RATE_LIMITED", 5),
                  OutcomeGroup("a", D2, "error:BUDGET_EXCEEDED", 3),
                  OutcomeGroup("a", D2, "error:DEADLINE_EXCEEDED", 1)])
    [a] = build_dashboard(WINDOW, figures).agents
    assert a.refused == {"RATE_LIMITED": 5, "BUDGET_EXCEEDED": 3}
    assert a.daily.refused == {"RATE_LIMITED": [0, 5, 0], "BUDGET_EXCEEDED": [0, 3, 0]}
    assert (a.totals.requests, a.totals.refused, a.totals.errors) == (20, 8, 1)
    assert a.errors_by_code == {"DEADLINE_EXCEEDED": 1}
    assert a.daily.errors == [0, 1, 0]
    # rates over the 12 requests admitted
    assert a.totals.error_rate == 1 / 12
    assert a.totals.fallback_rate == 2 / 12


def test_models_add_up_across_rollups_and_live_days_in_the_agents_currency() -> None:
    figures = Figures(
        rollups=[day("a", D1, 2, cost=1.0), day("a", D3, 3, cost=2.0),
                 RollupGroup(agent_id="a", model="big", grp=PER_MODEL, requests=2, cost=1.0),
                 RollupGroup(agent_id="a", model="big", grp=PER_MODEL, requests=3, cost=2.0)],
        feedback=[], policies={"a": AgentPolicy(currency="EUR")},
        as_of=dt.datetime(2026, 3, 3, 12, 0, 5, tzinfo=dt.UTC), live_days=[D3])
    dash = build_dashboard(WINDOW, figures)
    [a] = dash.agents
    assert (a.by_model["big"].requests, a.by_model["big"].cost) == (5, 3.0)
    assert a.currency == "EUR"
    assert (dash.as_of, dash.live_days) == ("2026-03-03T12:00:05+00:00", ["2026-03-03"])


def test_scores_show_their_divergence_largest_first_and_count_the_flagged() -> None:
    from services.doors.dashboard.rows import ScoreRow

    figures = Figures(rollups=[day("a", D1, 1)], feedback=[], policies={}, scores=[
        ScoreRow("a", "big", "RETRIEVAL", 12.0, 0.55, 0.5, 0.05, False),
        ScoreRow("a", "big", "PLATFORM", 40.0, 0.2, 0.6, -0.4, True),
        ScoreRow("nobody-in-window", "big", "PLATFORM", 1.0, 0.5, 0.5, 0.0, False)])
    [a] = build_dashboard(WINDOW, figures).agents
    assert [(s.query_type, s.divergence, s.diverged) for s in a.scores] == [
        ("PLATFORM", -0.4, True), ("RETRIEVAL", 0.05, False)]
    assert a.diverged == 1
    assert a.scores[0].global_score == 0.6


def test_an_agents_day_in_the_log_replaces_its_rollups_and_only_that_one() -> None:
    from services.doors.dashboard.live import LiveFigures, overlay, rollup_groups
    from services.doors.dashboard.rows import AgentDayLatency, OutcomeGroup

    rolled = LiveFigures(
        rollups=[day("a", D3, 5), day("b", D3, 7), day("a", D2, 1),
                 RollupGroup(agent_id="a", day=D3, model="big", grp=PER_DAY_MODEL,
                             requests=5, cost=1.0)],
        latency=[AgentDayLatency("a", D3, 5, 10.0, 20.0), AgentDayLatency("b", D3, 7)],
        outcomes=[OutcomeGroup("a", D3, "error:RATE_LIMITED", 2)])
    # The log has a's D3 (refreshed mid-day: it has grown since), not b's (seeded rollup).
    live = LiveFigures(rollup_groups([log_row("a", D3, "big", "RETRIEVAL", "rules", 9,
                                              cost=2.0, p95=50.0)]),
                       [AgentDayLatency("a", D3, 9, 25.0, 50.0)],
                       [OutcomeGroup("a", D3, "error:RATE_LIMITED", 4)])
    dash = build_dashboard(WINDOW, Figures(
        rollups=overlay(rolled, live).rollups, latency=overlay(rolled, live).latency,
        outcomes=overlay(rolled, live).outcomes, feedback=[], policies={}))
    a, b = dash.agents
    assert a.daily.requests == [0, 1, 9]
    assert a.daily.p95_ms[2] == 50.0
    assert a.by_model["big"].cost == 2.0
    assert a.refused == {"RATE_LIMITED": 4}
    assert b.daily.requests == [0, 0, 7]


async def test_stage_readings_are_shared_and_rated_over_the_time_between_them() -> None:
    import asyncio

    from services.doors.dashboard.stages import StageReader, StagesUnavailableError
    from shared.runtime.stage_status import Instance, Sample

    readings: list[float] = []
    now = {"t": 100.0}

    async def read(nc: object, timeout: float) -> Sample:
        readings.append(now["t"])
        await asyncio.sleep(0.01)
        if now["t"] >= 200:
            raise TimeoutError("no replies")
        handled = 10 * len(readings)
        return Sample(at=now["t"], lag={}, dead_letters={"classifier": 2}, instances=[
            Instance(id="c1", service="intentroute-classifier", stage="classifier",
                     handled=handled, errors=1, processing_ns=0)])

    reader = StageReader(None, min_interval=5.0, clock=lambda: now["t"],  # type: ignore[arg-type]
                         read=read)
    first, same = await asyncio.gather(reader.view(), reader.view())
    assert same is first  # concurrent callers wait for the one reading
    assert first.interval_s is None
    now["t"] += 4.0
    assert await reader.view() is first  # within min_interval: the same reading
    now["t"] += 6.0
    second = await reader.view()
    assert readings == [100.0, 110.0]
    assert second.interval_s == 10.0
    classifier = next(r for r in second.stages if r.stage == "classifier")
    assert (classifier.handled, classifier.errors, classifier.dead_letters) == (20, 1, 2)
    assert classifier.rate_per_s == 1.0  # 10 more handled in 10 s
    now["t"] = 300.0
    with pytest.raises(StagesUnavailableError, match="no replies"):
        await reader.view()


def test_the_charts_start_at_the_agents_first_day_with_data() -> None:
    """Issue 31: a 30-day window with one day of data drew every chart as an empty grid
    with one bar at its edge; the page draws from `first_day` to the window's end."""
    today = dt.date(2026, 3, 30)
    window = Window.ending(today, 30)
    figures = Figures(
        rollups=[day("new", today, 4), day("old", dt.date(2026, 3, 10), 1)],
        feedback=[FeedbackGroup(agent_id="fb", day=dt.date(2026, 3, 20), outcome="success",
                                n=1)],
        policies={})
    agents = {a.agent_id: a for a in build_dashboard(window, figures).agents}
    assert agents["new"].first_day == "2026-03-30"
    assert agents["old"].first_day == "2026-03-10"
    assert agents["fb"].first_day == "2026-03-20"  # feedback alone counts
