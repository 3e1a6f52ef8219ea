"""The operator dashboard on a real Postgres, served by aiohttp on 127.0.0.1 and opened
in a real headless Chromium: the figures it shows are the database's, and only the
dashboard token opens it."""

from __future__ import annotations

import datetime as dt
import random
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web

from bench.browser import LAUNCH_ARGS, find_chromium
from services.gateway.dashboard import add_dashboard_routes
from services.gateway.dashboard.auth import COOKIE
from services.gateway.dashboard.queries import (
    BREAKDOWN_SQL,
    DAYS_SQL,
    FEEDBACK_SQL,
    FeedbackGroup,
    RollupGroup,
)
from shared.policy.agent import AgentPolicy
from shared.store import asyncpg_dsn
from shared.store.policies import save_policy
from shared.store.stores import Store

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
TOKEN = "dash-" + uuid.uuid4().hex
RUN = uuid.uuid4().hex[:8]
IDE, CHAT, JOBS = (f"dash-{RUN}-{name}" for name in ("ide", "chat", "jobs"))
SLO = {IDE: 100.0, CHAT: 500.0, JOBS: None}
P95_RANGE = {IDE: (60.0, 160.0), CHAT: (200.0, 480.0), JOBS: (50.0, 900.0)}
MODELS = ("qwen2.5:1.5b", "extractive")
ROUTES = (("RETRIEVAL", "embedding"), ("PLATFORM", "rules"), ("CODE_GENERATION", "declared"))
OUTCOMES = ("success", "fallback", "user_rejected", "success", "timeout", "error")
CHROMIUM = find_chromium()


@dataclass
class Expected:
    """One agent's figures over the 30-day window, computed here from the seeded rows."""

    requests: int = 0
    errors: int = 0
    fallbacks: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    by_type: dict[str, int] = field(default_factory=dict)
    by_layer: dict[str, int] = field(default_factory=dict)
    p95_day: dict[dt.date, list[float]] = field(default_factory=dict)  # [sum p*n, n]
    exact: dict[dt.date, tuple[int, float]] = field(default_factory=dict)  # (n, p95)
    feedback: dict[str, int] = field(default_factory=dict)
    explicit: int = 0
    implicit: int = 0

    @property
    def fallback_rate(self) -> float:
        return self.fallbacks / self.requests

    def days(self) -> dict[dt.date, tuple[float, float]]:
        """Day -> (weight, p95): the exact figure where there is one, else the
        request-weighted mean of the day's rollup rows."""
        days = {d: (n, s / n) for d, (s, n) in self.p95_day.items() if n}
        days.update(self.exact)
        return days

    @property
    def p95(self) -> float:
        days = self.days().values()
        return sum(n * p for n, p in days) / sum(n for n, _ in days)

    def breach_days(self, slo: float | None) -> list[dt.date]:
        return sorted(d for d, (_, p) in self.days().items() if slo is not None and p > slo)


def exact_rows(today: dt.date) -> list[tuple[Any, ...]]:
    """Exact daily percentiles for IDE on three days: one far above its SLO, one far
    below, whatever the rollups' estimate says (the others keep the estimate)."""
    return [(today - dt.timedelta(days=back), IDE, n, p95 / 2, p95, p95 * 1.2)
            for back, n, p95 in ((1, 80, 400.0), (2, 90, 20.0), (6, 70, 99.0))]


def seed_rows(today: dt.date) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    rng = random.Random(1414)
    rollups: list[tuple[Any, ...]] = []
    feedback: list[tuple[Any, ...]] = []
    for agent in SLO:
        low, high = P95_RANGE[agent]
        for back in range(10):
            if back == 4:
                continue  # a day without traffic
            day = today - dt.timedelta(days=back)
            for model in MODELS:
                for query_type, layer in ROUTES:
                    n = rng.randint(1, 50)
                    p95 = (None if (model, query_type) == ("extractive", "PLATFORM")
                           else round(rng.uniform(low, high), 1))
                    rollups.append((
                        day, agent, model, query_type, layer, n, rng.randint(0, n // 5),
                        rng.randint(0, n // 3), n * 200, n * 40, n * 0.3,
                        round(rng.uniform(0, 0.05), 6), p95 and p95 / 2, p95,
                        p95 and p95 * 1.3))
            if agent != JOBS:
                for k in range(3):
                    at = dt.datetime.combine(day, dt.time(0, 5 + k), dt.UTC)
                    explicit = k == 0
                    feedback.append((agent, f"r{back}-{k}", OUTCOMES[(back + k) % 6],
                                     "explicit" if explicit else "implicit",
                                     float(back) if explicit else None, at, at))
        # older than the window: never counted
        old = today - dt.timedelta(days=40)
        rollups.append((old, agent, MODELS[0], "RETRIEVAL", "rules", 1000, 10, 10, 1, 1, 1.0,
                        99.0, 1.0, 9999.0, 9999.0))
        feedback.append((agent, "old", "error", "explicit", None,
                         *[dt.datetime.combine(old, dt.time(12), dt.UTC)] * 2))
    return rollups, feedback


def expectations(rollups: list[tuple[Any, ...]], feedback: list[tuple[Any, ...]],
                 exact: list[tuple[Any, ...]], today: dt.date) -> dict[str, Expected]:
    since = today - dt.timedelta(days=29)
    result = {agent: Expected() for agent in SLO}
    for day, agent, n, _p50, p95, _p99 in exact:
        result[agent].exact[day] = (n, p95)
    for (day, agent, _model, query_type, layer, n, errors, fallbacks, tin, tout, _cs, cost,
         _p50, p95, _p99) in rollups:
        if day < since:
            continue
        e = result[agent]
        e.requests += n
        e.errors += errors
        e.fallbacks += fallbacks
        e.tokens_in += tin
        e.tokens_out += tout
        e.cost += cost
        e.by_type[query_type] = e.by_type.get(query_type, 0) + n
        e.by_layer[layer] = e.by_layer.get(layer, 0) + n
        if p95 is not None:
            acc = e.p95_day.setdefault(day, [0.0, 0])
            acc[0] += p95 * n
            acc[1] += n
    for agent, _rid, outcome, source, _q, _created, updated in feedback:
        if updated.date() < since:
            continue
        e = result[agent]
        e.feedback[outcome] = e.feedback.get(outcome, 0) + 1
        if source == "explicit":
            e.explicit += 1
        else:
            e.implicit += 1
    return result


LATENCY_TABLE = """
CREATE TABLE IF NOT EXISTS daily_agent_latency (
    day date NOT NULL, agent_id varchar(128) NOT NULL,
    requests bigint NOT NULL DEFAULT 0, latency_p50_ms float8, latency_p95_ms float8,
    latency_p99_ms float8, updated_at timestamptz DEFAULT now(),
    PRIMARY KEY (day, agent_id))
"""


@pytest.fixture
async def seeded(store: Store) -> AsyncIterator[dict[str, Expected]]:
    today = dt.datetime.now(dt.UTC).date()
    rollups, feedback = seed_rows(today)
    await store.pool.copy_records_to_table(
        "daily_rollups", records=rollups,
        columns=["day", "agent_id", "model", "query_type", "layer", "requests", "errors",
                 "fallbacks", "tokens_in", "tokens_out", "compute_s", "cost",
                 "latency_p50_ms", "latency_p95_ms", "latency_p99_ms"])
    await store.pool.copy_records_to_table(
        "feedback", records=feedback,
        columns=["agent_id", "request_id", "outcome", "source", "completion_quality",
                 "created_at", "updated_at"])
    # `daily_agent_latency` comes with the accounting's migration (another branch until
    # it is merged); the same table is made here when this schema lacks it.
    await store.pool.execute(LATENCY_TABLE)
    exact = exact_rows(today)
    await store.pool.copy_records_to_table(
        "daily_agent_latency", records=exact,
        columns=["day", "agent_id", "requests", "latency_p50_ms", "latency_p95_ms",
                 "latency_p99_ms"])
    for agent, slo in SLO.items():
        if slo is not None:
            await save_policy(store.pool, agent, AgentPolicy(slo_p95_ms=slo))
    expected = expectations(rollups, feedback, exact, today)
    # The seed is meant to exercise both sides of the SLO.
    assert 1 <= len(expected[IDE].breach_days(SLO[IDE])) < 9
    yield expected
    agents = list(SLO)
    for table in ("daily_rollups", "feedback", "agent_policies", "daily_agent_latency"):
        await store.pool.execute(f"DELETE FROM {table} WHERE agent_id = ANY($1)", agents)


@asynccontextmanager
async def serve(store: Store | asyncpg.Pool, **kwargs: Any) -> AsyncIterator[str]:
    app = web.Application()
    add_dashboard_routes(app, store.pool if isinstance(store, Store) else store, **kwargs)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}/dashboard"
    finally:
        await runner.cleanup()


def assert_matches(agent: dict[str, Any], e: Expected, slo: float | None) -> None:
    t = agent["totals"]
    assert (t["requests"], t["errors"], t["fallbacks"], t["tokens_in"], t["tokens_out"]) == (
        e.requests, e.errors, e.fallbacks, e.tokens_in, e.tokens_out)
    assert t["cost"] == pytest.approx(e.cost)
    assert t["fallback_rate"] == pytest.approx(e.fallback_rate)
    assert t["p95_ms"] == pytest.approx(e.p95)
    assert agent["by_type"] == e.by_type
    assert agent["by_layer"] == e.by_layer
    assert agent["slo_p95_ms"] == slo
    assert agent["slo_breaches"] == len(e.breach_days(slo))
    fb = agent["feedback"]
    assert fb["outcomes"] == e.feedback
    assert (fb["explicit"], fb["implicit"]) == (e.explicit, e.implicit)


async def test_json_figures_match_the_database(store: Store,
                                               seeded: dict[str, Expected]) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    async with (serve(store, token=TOKEN) as url, aiohttp.ClientSession() as http,
                http.get(url + "/api/data", headers=bearer) as response):
        assert response.status == 200
        assert response.headers["Cache-Control"] == "no-store"
        data = await response.json()
    assert len(data["days"]) == 30
    agents = {a["agent_id"]: a for a in data["agents"]}
    for agent_id, slo in SLO.items():
        assert_matches(agents[agent_id], seeded[agent_id], slo)
    ide = agents[IDE]
    breached = [dt.date.fromisoformat(day) for day, b in
                zip(data["days"], ide["daily"]["breach"], strict=True) if b]
    assert breached == seeded[IDE].breach_days(SLO[IDE])
    gap = data["days"].index((dt.datetime.now(dt.UTC).date()
                              - dt.timedelta(days=4)).isoformat())
    assert ide["daily"]["requests"][gap] == 0
    assert ide["daily"]["p95_ms"][gap] is None
    assert agents[JOBS]["feedback"]["total"] == 0


async def test_rows_map_onto_the_figures_structs_by_column_order(store: Store,
                                                                 seeded: Any) -> None:
    today = dt.datetime.now(dt.UTC).date()
    since = today - dt.timedelta(days=29)
    for sql in (DAYS_SQL, BREAKDOWN_SQL):
        rollup = await store.pool.fetchrow(sql + " LIMIT 1", since, today)
        assert tuple(rollup.keys()) == RollupGroup.__struct_fields__
    start = dt.datetime.combine(since, dt.time(), dt.UTC)
    fb = await store.pool.fetchrow(FEEDBACK_SQL + " LIMIT 1", since, today, start,
                                   start + dt.timedelta(days=30))
    assert tuple(fb.keys()) == FeedbackGroup.__struct_fields__


async def test_dashboard_is_off_without_a_token(store: Store) -> None:
    async with serve(store, token="") as url, aiohttp.ClientSession() as http:
        for path in ("", "/api/data", "/static/dashboard.js"):
            async with http.get(url + path) as response:
                assert response.status == 404


async def test_only_the_dashboard_token_opens_it(store: Store) -> None:
    clock = {"now": 1_000_000.0}
    async with serve(store, token=TOKEN, session_ttl=60.0,
                     clock=lambda: clock["now"]) as url, aiohttp.ClientSession() as http:
        async with http.get(url) as response:  # the login form, not the page
            assert response.status == 401
            assert 'name="token"' in await response.text()
        async with http.get(url + "/api/data") as response:
            assert response.status == 401
        async with http.get(url + "/api/data",
                            headers={"Authorization": "Bearer " + TOKEN[:-1]}) as response:
            assert response.status == 401
        async with http.post(url + "/login", data={"token": "wrong"},
                             allow_redirects=False) as response:
            assert response.status == 401
            assert "Wrong token" in await response.text()
            assert COOKIE not in response.cookies
        async with http.post(url + "/login", data={"token": TOKEN},
                             allow_redirects=False) as response:
            assert response.status == 303
            morsel = response.cookies[COOKIE]
            assert morsel["httponly"]
            assert morsel["samesite"] == "Strict"
            assert TOKEN not in morsel.value
        cookie = {"Cookie": f"{COOKIE}={morsel.value}"}
        async with http.get(url + "/api/data", headers=cookie) as response:
            assert response.status == 200
        async with http.get(url + "/api/data?days=0", headers=cookie) as response:
            assert response.status == 400
        forged = morsel.value[:-1] + ("0" if morsel.value[-1] != "0" else "1")
        async with http.get(url + "/api/data",
                            headers={"Cookie": f"{COOKIE}={forged}"}) as response:
            assert response.status == 401
        clock["now"] += 61  # the session expired
        async with http.get(url + "/api/data", headers=cookie) as response:
            assert response.status == 401


async def test_an_unreachable_database_is_a_503_not_a_crash(database_url: str) -> None:
    pool = await asyncpg.create_pool(asyncpg_dsn(database_url), min_size=1, max_size=1)
    await pool.close()
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    async with (serve(pool, token=TOKEN) as url, aiohttp.ClientSession() as http,
                http.get(url + "/api/data", headers=bearer) as response):
        assert response.status == 503
        assert (await response.json())["error"] == "figures unavailable, try again"


def number(text: str) -> float:
    return float(text.replace("%", "").strip())


@pytest.mark.skipif(CHROMIUM is None, reason=(
    "no Chromium found: `make browser` installs Debian's chromium package "
    "(or set INTENTROUTE_CHROMIUM to a Chromium binary)"))
async def test_page_in_chromium_shows_the_database_figures(
        store: Store, seeded: dict[str, Expected], capsys: pytest.CaptureFixture[str]) -> None:
    from playwright.async_api import async_playwright, expect

    problems: list[str] = []
    async with serve(store, token=TOKEN) as url, async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda m: m.type == "error" and problems.append(m.text))
            page.on("pageerror", lambda exc: problems.append(str(exc)))
            data_requests: list[str] = []
            page.on("request", lambda r: "/api/data" in r.url and data_requests.append(r.url))
            await page.goto(url)
            # The login form comes with a 401, which Chromium reports; nothing else may.
            assert all("401" in p for p in problems), problems
            problems.clear()
            await page.fill('input[name="token"]', TOKEN)
            await page.click('button[type="submit"]')
            await page.wait_for_selector('body[data-ready="1"]', timeout=20_000)
            assert len(data_requests) == 1  # the preloaded request is the one used
            assert await page.input_value("#days") == "30"

            for agent_id, slo in SLO.items():
                e = seeded[agent_id]
                row = page.locator(f'#agents tr[data-agent="{agent_id}"]')
                cells = {f: await row.locator(f'td[data-field="{f}"]').inner_text()
                         for f in ("requests", "errors", "fallback_rate", "cost", "p95",
                                   "slo_breaches", "feedback")}
                assert int(cells["requests"]) == e.requests
                assert int(cells["errors"]) == e.errors
                assert number(cells["fallback_rate"]) == pytest.approx(
                    100 * e.fallback_rate, abs=0.05)
                assert number(cells["cost"]) == pytest.approx(e.cost, abs=0.5e-4)
                assert number(cells["p95"]) == pytest.approx(e.p95, abs=0.5)
                assert int(cells["slo_breaches"]) == len(e.breach_days(slo))
                total = e.explicit + e.implicit
                assert cells["feedback"] == f"{total} ({e.explicit} / {e.implicit})"

            await page.click(f'#agents tr[data-agent="{IDE}"]')
            e = seeded[IDE]
            tile = page.locator("#tiles")
            assert int(await tile.locator('[data-field="requests"]').inner_text()) == e.requests
            assert int(await tile.locator('[data-field="slo_breaches"]').inner_text()) == len(
                e.breach_days(SLO[IDE]))
            legend = await page.locator('.legend[data-field="breach_days"]').inner_text()
            assert legend == "Breached on " + ", ".join(
                d.isoformat() for d in e.breach_days(SLO[IDE]))
            outcomes = await page.locator('.legend[data-field="outcomes"]').inner_text()
            for outcome, count in e.feedback.items():
                assert f"{outcome} {count}" in outcomes
            # six charts drawn, each with data
            charts = await page.evaluate(
                "Object.values(Chart.instances).map(c => [c.canvas.id,"
                " c.data.datasets.length, c.canvas.width])")
            assert sorted(c[0] for c in charts) == sorted(
                f"chart-{n}" for n in ("type", "layer", "latency", "fallback", "cost",
                                       "feedback"))
            assert all(datasets > 0 and width > 0 for _, datasets, width in charts)

            ARTIFACTS.mkdir(exist_ok=True)
            shot = ARTIFACTS / "dashboard.png"
            await page.screenshot(path=str(shot), full_page=True)

            # Another window: the figures are asked for again, for 7 days.
            week_start = dt.datetime.now(dt.UTC).date() - dt.timedelta(days=6)
            await page.select_option("#days", "7")
            await expect(page.locator("#range")).to_contain_text(week_start.isoformat())
            await expect(page.locator("body")).to_have_attribute("data-ready", "1")
            assert data_requests[-1].endswith("/api/data?days=7")
        finally:
            await browser.close()
    assert shot.stat().st_size > 10_000
    assert problems == []  # no script error, no CSP violation
    with capsys.disabled():
        print(f"\ndashboard screenshot: {shot}")
