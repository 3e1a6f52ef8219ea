"""The dashboard's figures from rollup and feedback groups (no database), and its
session cookie."""

from __future__ import annotations

import datetime as dt

from services.gateway.dashboard.auth import session_cookie, session_valid, token_matches
from services.gateway.dashboard.figures import build_dashboard
from services.gateway.dashboard.queries import (
    PER_DAY,
    PER_DAY_LAYER,
    PER_DAY_TYPE,
    PER_MODEL,
    FeedbackGroup,
    Figures,
    RollupGroup,
    Window,
)
from services.gateway.dashboard.settings import DashboardSettings
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
    from services.gateway.dashboard.queries import AgentDayLatency

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
