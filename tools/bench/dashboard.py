"""Dashboard benchmark: how long the operator dashboard takes to load with a month of
data for 50 agents.

An embedded Postgres gets a year of daily rollups (what the 1-year rollup retention
keeps: 50 agents x 2 models x 4 query types x 3 layers per day; and a year of exact
daily percentiles per agent where the schema has `daily_agent_latency`), 90 days of
feedback (every verdict is kept) and today's request log (`today_rows`, 33,000 by
default: a day of 1,000,000 requests a month, which every load reads live since today
is never final in the rollups), the doors' dashboard routes serve it on
127.0.0.1, and:

The dashboard is served by a process of its own (as the gateway would), the clients
run here.

- `dashboard_load_ms`: the real page load in headless Chromium (Debian's package, no
  cache, a fresh browser context each time): navigation start until every chart of
  the first agent is drawn and the all-agents table filled (the page's own
  `performance.now()` when it marks itself ready), median of `loads` loads. Without
  a Chromium it is the HTTP figure below and `dashboard_load_measure` says "http".
- `dashboard_http_ms`: GET of the page + GET of its JSON, median;
  `dashboard_api_ms`: the JSON alone (the rollups' indexed statements and today's log
  read live, the figures of 50 agents).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import multiprocessing
import os
import random
import secrets
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import uvloop
from aiohttp import web

from bench.browser import LAUNCH_ARGS, find_chromium
from intentroute.stack import PostgresServer
from services.doors.dashboard import add_dashboard_routes
from shared.policy.agent import AgentPolicy
from shared.store import asyncpg_dsn, migrate
from shared.store.policies import save_policy

MODELS = ("qwen2.5:7b", "extractive")
TYPES = ("RETRIEVAL", "CODE_GENERATION", "CONVERSATIONAL", "PLATFORM")
LAYERS = ("rules", "embedding", "llm")
OUTCOMES = ("success", "success", "success", "fallback", "timeout", "error", "user_rejected")


async def seed(pool: asyncpg.Pool, *, agents: int, history_days: int, feedback_days: int,
               feedback_per_day: int, until: dt.date, today_rows: int = 0
               ) -> dict[str, int]:
    """Rollups and feedback for agents `bench-dash-NN`, ending on `until`, and
    `today_rows` of today's request log; row counts."""
    rng = random.Random(14)
    ids = [f"bench-dash-{i:02d}" for i in range(agents)]
    rollups = []
    for back in range(history_days):
        day = until - dt.timedelta(days=back)
        for agent in ids:
            for model in MODELS:
                for query_type in TYPES:
                    for layer in LAYERS:
                        requests = rng.randint(20, 400)
                        p50 = rng.uniform(20, 300)
                        rollups.append((
                            day, agent, model, query_type, layer, requests,
                            rng.randint(0, requests // 20), rng.randint(0, requests // 10),
                            requests * 300, requests * 120, requests * 0.4,
                            requests * 0.0004, p50, p50 * 2.2, p50 * 3.1))
    await pool.copy_records_to_table(
        "daily_rollups", records=rollups,
        columns=["day", "agent_id", "model", "query_type", "layer", "requests", "errors",
                 "fallbacks", "tokens_in", "tokens_out", "compute_s", "cost",
                 "latency_p50_ms", "latency_p95_ms", "latency_p99_ms"])
    feedback = []
    end = dt.datetime.combine(until, dt.time(), dt.UTC) + dt.timedelta(days=1)
    for back in range(feedback_days):
        for agent in ids:
            for n in range(feedback_per_day):
                at = end - dt.timedelta(days=back, seconds=(n * 863) % 86400 + 1)
                outcome = OUTCOMES[rng.randrange(len(OUTCOMES))]
                feedback.append((agent, f"r{back}-{n}", outcome,
                                 "explicit" if n % 3 == 0 else "implicit",
                                 float(rng.randint(0, 10)) if n % 3 == 0 else None,
                                 at, at))
    await pool.copy_records_to_table(
        "feedback", records=feedback,
        columns=["agent_id", "request_id", "outcome", "source", "completion_quality",
                 "created_at", "updated_at"])
    for i, agent in enumerate(ids):
        await save_policy(pool, agent, AgentPolicy(slo_p95_ms=250.0 + 10 * i))
    counts = {"rollup_rows": len(rollups), "feedback_rows": len(feedback)}
    if today_rows:
        start = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
        log = [(ids[n % agents], f"today-{n}", "s", start + dt.timedelta(seconds=n / 10),
                MODELS[n % 2], TYPES[n % 4], LAYERS[n % 3],
                "ok" if n % 50 else "error:RATE_LIMITED", 300, 120, rng.uniform(20, 600),
                n % 10 == 0)
               for n in range(today_rows)]
        await pool.copy_records_to_table(
            "request_log", records=log,
            columns=["agent_id", "request_id", "session_id", "created_at", "model",
                     "query_type", "layer", "outcome", "tokens_in", "tokens_out",
                     "total_ms", "fallback"])
        await pool.execute("ANALYZE request_log")
        counts["today_log_rows"] = today_rows
    if await pool.fetchval("SELECT to_regclass('daily_agent_latency') IS NOT NULL"):
        latency = [(until - dt.timedelta(days=back), agent, 2400, p50, p50 * 2.2, p50 * 3.1)
                   for back in range(history_days) for agent in ids
                   for p50 in (rng.uniform(20, 300),)]
        await pool.copy_records_to_table(
            "daily_agent_latency", records=latency,
            columns=["day", "agent_id", "requests", "latency_p50_ms", "latency_p95_ms",
                     "latency_p99_ms"])
        await pool.execute("ANALYZE daily_agent_latency")
        counts["latency_rows"] = len(latency)
    await pool.execute("ANALYZE daily_rollups; ANALYZE feedback")
    return counts


async def index_use(pool: asyncpg.Pool, until: dt.date, days: int) -> dict[str, list[str]]:
    """The scans the planner picks for the dashboard's queries (EXPLAIN)."""
    from services.doors.dashboard.queries import BREAKDOWN_SQL, DAYS_SQL, FEEDBACK_SQL
    from services.doors.dashboard.rows import Window

    window = Window.ending(until, days)
    start, end = window.bounds()
    plans = {}
    for name, sql, args in (("rollup_days", DAYS_SQL, (window.since, window.until)),
                            ("rollup_breakdown", BREAKDOWN_SQL,
                             (window.since, window.until)),
                            ("feedback", FEEDBACK_SQL,
                             (window.since, window.until, start, end))):
        text = "\n".join(r[0] for r in await pool.fetch("EXPLAIN " + sql, *args))
        plans[name] = sorted({line.strip().lstrip("-> ").split("  ")[0] for line in
                              text.splitlines() if "Scan" in line})
    return plans


async def _browser_loads(url: str, token: str, loads: int) -> list[float]:
    from playwright.async_api import async_playwright

    executable = find_chromium()
    assert executable
    samples = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=executable, args=LAUNCH_ARGS)
        try:
            for _ in range(loads + 1):  # the first warms the server (imports, plans)
                context = await browser.new_context(
                    extra_http_headers={"Authorization": f"Bearer {token}"},
                    viewport={"width": 1400, "height": 1000})
                page = await context.new_page()
                await page.goto(url)
                await page.wait_for_selector('body[data-ready="1"]', timeout=30_000)
                samples.append(float(await page.evaluate("document.body.dataset.readyMs")))
                await context.close()
        finally:
            await browser.close()
    return samples[1:]


async def _http_loads(url: str, token: str, loads: int) -> tuple[list[float], list[float]]:
    headers = {"Authorization": f"Bearer {token}"}
    page_and_api, api = [], []
    async with aiohttp.ClientSession(headers=headers) as http:
        for i in range(loads + 1):
            t0 = time.perf_counter()
            async with http.get(url) as response:
                assert response.status == 200, response.status
                await response.read()
            t1 = time.perf_counter()
            async with http.get(url + "/api/data") as response:
                assert response.status == 200, response.status
                await response.read()
            t2 = time.perf_counter()
            if i:
                page_and_api.append((t2 - t0) * 1000)
                api.append((t2 - t1) * 1000)
    return page_and_api, api


def _serve(database_url: str, token: str, days: int, ports: Any) -> None:
    """The gateway's part, in a process of its own as in production (on uvloop, as the
    workers run): the dashboard's routes on 127.0.0.1, its port put on `ports`."""

    async def main() -> None:
        pool = await asyncpg.create_pool(asyncpg_dsn(database_url), min_size=2, max_size=4)
        app = web.Application()
        add_dashboard_routes(app, pool, token=token, default_days=days)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        ports.put(runner.addresses[0][1])
        await asyncio.Event().wait()  # until terminated

    uvloop.run(main())


@contextlib.contextmanager
def _server(database_url: str, token: str, days: int) -> Iterator[str]:
    spawn = multiprocessing.get_context("spawn")
    ports = spawn.Queue()
    proc = spawn.Process(target=_serve, args=(database_url, token, days, ports), daemon=True)
    proc.start()
    try:
        yield f"http://127.0.0.1:{ports.get(timeout=120)}/dashboard"
    finally:
        proc.terminate()
        proc.join(10)


async def _run(database_url: str, *, agents: int, days: int, history_days: int,
               feedback_days: int, feedback_per_day: int, loads: int,
               today_rows: int) -> dict[str, Any]:
    until = dt.datetime.now(dt.UTC).date()
    pool = await asyncpg.create_pool(asyncpg_dsn(database_url), min_size=1, max_size=2)
    assert pool is not None
    try:
        t = time.perf_counter()
        counts = await seed(pool, agents=agents, history_days=history_days,
                            feedback_days=feedback_days, feedback_per_day=feedback_per_day,
                            until=until, today_rows=today_rows)
        seed_s = time.perf_counter() - t
        token = secrets.token_urlsafe(32)
        load_before = os.getloadavg()[0]
        with _server(database_url, token, days) as url:
            http_ms, api_ms = await _http_loads(url, token, loads)
            browser_ms = await _browser_loads(url, token, loads) if find_chromium() else []
        http_median = round(statistics.median(http_ms), 1)
        return {
            "dashboard_load_ms": (round(statistics.median(browser_ms), 1) if browser_ms
                                  else http_median),
            "dashboard_load_measure": "chromium" if browser_ms else "http",
            "dashboard_load_samples_ms": [round(x, 1) for x in browser_ms or http_ms],
            "dashboard_http_ms": http_median,
            "dashboard_api_ms": round(statistics.median(api_ms), 1),
            "agents": agents, "window_days": days, "rollup_days": history_days,
            "feedback_days": feedback_days, **counts, "seed_s": round(seed_s, 1),
            # Other work on the machine slows every figure above; this says how much.
            "load_average_1m": [round(load_before, 1), round(os.getloadavg()[0], 1)],
            "cpus": os.cpu_count(),
            "scans": await index_use(pool, until, days),
        }
    finally:
        await pool.close()


def run(*, agents: int = 50, days: int = 30, history_days: int = 365,
        feedback_days: int = 90, feedback_per_day: int = 100, loads: int = 7,
        today_rows: int = 33_000, database_url: str = "") -> dict[str, Any]:
    """Seed a fresh embedded Postgres (or `database_url`, which must be empty of these
    agents) and measure; the figures as one JSON-able dict."""
    kwargs: dict[str, Any] = dict(agents=agents, days=days, history_days=history_days,
                                  feedback_days=feedback_days,
                                  feedback_per_day=feedback_per_day, loads=loads,
                                  today_rows=today_rows)
    if database_url:
        migrate(database_url)
        return asyncio.run(_run(database_url, **kwargs))
    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as tmp:
        pg = PostgresServer(Path(tmp) / "postgres").start()
        try:
            migrate(pg.url)
            return asyncio.run(_run(pg.url, **kwargs))
        finally:
            pg.stop()
