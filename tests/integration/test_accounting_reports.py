"""`intentroute report costs|slo` on a real Postgres with a seeded request log: the cost
report's sums equal the log's, refusals at admission are broken out by code and never
billed, an outlier day gets its anomaly line, a day over the agent's SLO is flagged, and
hashed agent ids are stable and not the raw ids."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from typer.testing import CliRunner

from intentroute.cli import app
from shared.accounting.costs import cost_report, price_cost
from shared.accounting.hashing import agent_hasher
from shared.accounting.rollups import prices_of, refresh_rollups
from shared.policy.agent import AgentPolicy, Price, apply_assignment
from shared.store import asyncpg_dsn
from shared.store.partitions import ensure_partitions
from shared.store.policies import load_policies, save_policy
from tests.helpers.databases import fresh_database

pytestmark = pytest.mark.integration

TODAY = datetime.now(UTC).date()
SINCE, UNTIL = TODAY - timedelta(days=5), TODAY
MAIN = "big"
KEY = b"k" * 32

POLICIES = {
    "acct-a": ["price.big=0.5,1.5", "price.small=0.1,0.2,0.01", "currency=EUR"],
    "acct-b": ["price.small=0.2,0.4,0.02"],  # no price for the main model
    "acct-spiky": ["price.big=1.0,0"],
    "acct-slo": ["slo_p95_ms=100"],
}


def at(days_ago: int, hour: int) -> datetime:
    return datetime.combine(TODAY - timedelta(days=days_ago), datetime.min.time(),
                            tzinfo=UTC) + timedelta(hours=hour)


def seed_rows() -> list[dict[str, Any]]:
    rnd = random.Random(14)
    rows: list[dict[str, Any]] = []
    for agent in ("acct-a", "acct-b"):
        for n in range(300):
            model = rnd.choice(["big", "small", "extractive", "", "mystery"])
            tokens = model not in ("extractive", "")
            rows.append({
                "agent_id": agent, "request_id": f"{agent}-{n}",
                "created_at": at(rnd.randint(0, 5), rnd.randint(0, 23)), "model": model,
                "tokens_in": rnd.randint(10, 2000) if tokens else 0,
                "tokens_out": rnd.randint(1, 800) if tokens else 0,
                "compute_ms": rnd.uniform(50, 3000) if model == "small" else None,
                "total_ms": rnd.uniform(5, 900), "outcome": "ok" if model else "error:X"})
    # Refused at admission, as the gateway logs them (no model, no tokens, no time).
    for n, (code, days_ago) in enumerate([("RATE_LIMITED", 0)] * 3 + [("RATE_LIMITED", 2)]
                                         + [("BUDGET_EXCEEDED", 1)] * 2
                                         + [("CONCURRENCY_LIMITED", 4)]):
        rows.append({
            "agent_id": "acct-a", "request_id": f"refused-{n}",
            "created_at": at(days_ago, 12), "model": "", "tokens_in": 0, "tokens_out": 0,
            "compute_ms": None, "total_ms": None, "outcome": f"error:{code}"})
    # 20 ordinary days, then today at 20 times the tokens.
    for days_ago in range(0, 21):
        for n in range(5):
            rows.append({
                "agent_id": "acct-spiky", "request_id": f"spiky-{days_ago}-{n}",
                "created_at": at(days_ago, 10 + n), "model": "big",
                "tokens_in": (20000 if days_ago == 0 else 900 + 20 * (days_ago % 7)),
                "tokens_out": 0, "compute_ms": None, "total_ms": 20.0, "outcome": "ok"})
    # Day 2 ago well under the SLO (p95 100 ms), day 1 ago over it.
    for days_ago, top in ((2, 60.0), (1, 500.0)):
        for n in range(20):
            rows.append({
                "agent_id": "acct-slo", "request_id": f"slo-{days_ago}-{n}",
                "created_at": at(days_ago, n), "model": "", "tokens_in": 0, "tokens_out": 0,
                "compute_ms": None, "total_ms": 10.0 + (top - 10.0) * n / 19,
                "outcome": "ok"})
    return rows


ROWS = seed_rows()


def policies() -> dict[str, AgentPolicy]:
    result = {}
    for agent, assignments in POLICIES.items():
        policy = AgentPolicy()
        for assignment in assignments:
            policy = apply_assignment(policy, assignment)
        result[agent] = policy
    return result


def expected(agent: str) -> dict[str, Any]:
    """The agent's figures computed row by row from what was seeded."""
    prices = prices_of(policies()).get(agent, {})
    mine = [r for r in ROWS if r["agent_id"] == agent
            and SINCE <= r["created_at"].date() <= UNTIL]

    def cost(row: dict[str, Any], price: Price | None) -> float:
        if price is None:
            return 0.0
        return price_cost(price, row["tokens_in"], row["tokens_out"],
                          (row["compute_ms"] or 0.0) / 1000)

    main = prices.get(MAIN)
    return {
        "agent_id": agent, "requests": len(mine),
        "tokens_in": sum(r["tokens_in"] for r in mine),
        "tokens_out": sum(r["tokens_out"] for r in mine),
        "cost": sum(cost(r, prices.get(r["model"])) for r in mine),
        "main_slot_cost": sum(cost(r, main) for r in mine) if main else None,
    }


@pytest.fixture(scope="module")
def db(database_url: str) -> Iterator[str]:
    with fresh_database(database_url) as url:
        yield url


@pytest.fixture(scope="module")
async def seeded(db: str) -> str:
    conn = await asyncpg.connect(asyncpg_dsn(db))
    try:
        await conn.executemany(
            "INSERT INTO request_log (agent_id, request_id, session_id, created_at, model, "
            "tokens_in, tokens_out, compute_ms, total_ms, outcome) "
            "VALUES ($1, $2, 's', $3, $4, $5, $6, $7, $8, $9)",
            [(r["agent_id"], r["request_id"], r["created_at"], r["model"], r["tokens_in"],
              r["tokens_out"], r["compute_ms"], r["total_ms"], r["outcome"]) for r in ROWS])
        await ensure_partitions(conn, [])  # past days waited in the DEFAULT partition
        for agent, policy in policies().items():
            await save_policy(conn, agent, policy)
    finally:
        await conn.close()
    return db


async def cli(db: str, *args: str, env: dict[str, str] | None = None,
              code: int = 0) -> Any:
    result = await asyncio.to_thread(CliRunner().invoke, app, list(args), env={
        "DATABASE_URL": db, "OLLAMA_MODEL_NAME": MAIN, "AGENT_HASH_KEY": "",
        "AGENT_HASH_KEY_FILE": "", **(env or {})})
    assert result.exit_code == code, result.output
    return result


def window() -> list[str]:
    return ["--since", SINCE.isoformat(), "--until", UNTIL.isoformat()]


async def test_cost_report_sums_equal_the_log(seeded: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(seeded))
    try:
        stored = await load_policies(conn)
        await refresh_rollups(conn, SINCE, UNTIL, prices_of(stored))
        report = await cost_report(conn, SINCE, UNTIL, prices=prices_of(stored),
                                   main_model=MAIN)
        log_tokens = await conn.fetchval(
            "SELECT sum(tokens_in) FROM request_log WHERE agent_id = 'acct-a' "
            "AND created_at >= $1", at(5, 0))
    finally:
        await conn.close()
    agents = {a.agent_id: a for a in report.agents}
    for name in ("acct-a", "acct-b"):
        want, got = expected(name), agents[name]
        assert (got.requests, got.tokens_in, got.tokens_out) == (
            want["requests"], want["tokens_in"], want["tokens_out"])
        assert got.cost == pytest.approx(want["cost"], rel=1e-9)
        assert sum(m.requests for m in got.models) == want["requests"]
    assert agents["acct-a"].tokens_in == log_tokens
    a = agents["acct-a"]
    assert a.main_slot_cost == pytest.approx(expected("acct-a")["main_slot_cost"], rel=1e-9)
    assert a.saving == pytest.approx(a.main_slot_cost - a.cost)
    assert a.saving > 0  # part of its traffic went to the cheaper model
    assert (agents["acct-b"].main_slot_cost, agents["acct-b"].saving) == (None, None)
    assert {(u["agent_id"], u["model"]) for u in report.unpriced} == {
        ("acct-a", "mystery"), ("acct-b", "mystery"), ("acct-b", "big")}


async def test_report_costs_json_lists_agents_with_the_agreed_keys(seeded: str) -> None:
    report = json.loads((await cli(seeded, "report", "costs", "--json", *window())).stdout)
    agents = {a["agent_id"]: a for a in report["agents"]}
    for name in ("acct-a", "acct-b"):
        want = expected(name)
        got = agents[name]
        assert {"agent_id", "requests", "tokens_in", "tokens_out", "cost"} <= got.keys()
        assert (got["requests"], got["tokens_in"], got["tokens_out"]) == (
            want["requests"], want["tokens_in"], want["tokens_out"])
        assert got["cost"] == pytest.approx(want["cost"], rel=1e-9)
    assert report["main_model"] == MAIN


async def test_report_costs_csv_has_a_line_per_agent_and_model(seeded: str) -> None:
    out = (await cli(seeded, "report", "costs", "--csv", *window())).stdout
    lines = list(csv.DictReader(io.StringIO(out)))
    a_models = [row for row in lines if row["agent_id"] == "acct-a" and row["model"] != "*"]
    (a_total,) = [row for row in lines if row["agent_id"] == "acct-a" and row["model"] == "*"]
    assert sum(float(row["cost"]) for row in a_models) == pytest.approx(float(a_total["cost"]))
    assert float(a_total["cost"]) == pytest.approx(expected("acct-a")["cost"], rel=1e-9)
    assert int(a_total["tokens_in"]) == expected("acct-a")["tokens_in"]


REFUSED_A = {"RATE_LIMITED": 4, "CONCURRENCY_LIMITED": 1, "BUDGET_EXCEEDED": 2}


async def test_the_report_breaks_refusals_out_by_code_and_never_bills_them(
        seeded: str) -> None:
    report = json.loads((await cli(seeded, "report", "costs", "--json", *window())).stdout)
    agents = {a["agent_id"]: a for a in report["agents"]}
    a = agents["acct-a"]
    assert list(a["refused"].items()) == list(REFUSED_A.items())
    assert agents["acct-b"]["refused"] == {}
    assert report["totals"]["refused"] == REFUSED_A
    # Counted among the requests, priced at nothing: the cost is the answered rows'.
    assert a["requests"] == expected("acct-a")["requests"]
    assert a["cost"] == pytest.approx(expected("acct-a")["cost"], rel=1e-9)
    unanswered = next(m for m in a["models"] if m["model"] == "")
    assert (unanswered["cost"], unanswered["tokens_in"]) == (0, 0)
    assert a["currency"] == "EUR"
    assert report["totals"]["cost_by_currency"]["EUR"] == pytest.approx(a["cost"])

    text = (await cli(seeded, "report", "costs", *window())).stdout
    (line,) = [ln for ln in text.splitlines() if ln.startswith("acct-a ")]
    assert "RATE_LIMITED 4, CONCURRENCY_LIMITED 1, BUDGET_EXCEEDED 2" in line
    assert f"{a['cost']:.4f} EUR" in line
    rows = list(csv.DictReader(io.StringIO(
        (await cli(seeded, "report", "costs", "--csv", *window())).stdout)))
    (total,) = [r for r in rows if r["agent_id"] == "acct-a" and r["model"] == "*"]
    assert (total["refused_rate_limited"], total["refused_concurrency_limited"],
            total["refused_quota_exceeded"], total["refused_budget_exceeded"]) == (
        "4", "1", "0", "2")
    # A window without the older refusals: today's only.
    today = ["--since", TODAY.isoformat(), "--until", TODAY.isoformat()]
    report = json.loads((await cli(seeded, "report", "costs", "--json", *today)).stdout)
    a = next(x for x in report["agents"] if x["agent_id"] == "acct-a")
    assert a["refused"] == {"RATE_LIMITED": 3}


async def test_an_outlier_day_gets_an_anomaly_line(seeded: str) -> None:
    # The window is today only; the rule reads the 28 days before from the rollups.
    args = ["--since", TODAY.isoformat(), "--until", TODAY.isoformat()]
    out = (await cli(seeded, "report", "costs", *args)).stdout
    anomaly_lines = [line for line in out.splitlines() if line.startswith("ANOMALY")]
    assert len(anomaly_lines) == 1
    assert anomaly_lines[0].startswith(f"ANOMALY acct-spiky {TODAY.isoformat()}: cost 100.0000")
    report = json.loads((await cli(seeded, "report", "costs", "--json", *args)).stdout)
    (anomaly,) = report["anomalies"]
    assert anomaly["agent_id"] == "acct-spiky"
    assert anomaly["history_days"] == 20
    assert anomaly["cost"] > anomaly["threshold"]
    # Yesterday, an ordinary day, is not flagged.
    yesterday = (TODAY - timedelta(days=1)).isoformat()
    report = json.loads((await cli(seeded, "report", "costs", "--json", "--since", yesterday,
                                   "--until", yesterday)).stdout)
    assert report["anomalies"] == []


async def test_a_day_over_the_agents_slo_is_flagged(seeded: str) -> None:
    report = json.loads((await cli(seeded, "report", "slo", "--json", *window())).stdout)
    agent = next(a for a in report["agents"] if a["agent_id"] == "acct-slo")
    days = {d["day"]: d for d in agent["days"]}
    over, under = (TODAY - timedelta(days=1)).isoformat(), (TODAY - timedelta(days=2)).isoformat()
    assert (days[over]["breach"], days[under]["breach"]) == (True, False)
    assert days[over]["p95_ms"] > 100 > days[under]["p95_ms"]
    # percentile_cont over 20 evenly spaced values from 10 to 60: p50 = 35.
    assert days[under]["p50_ms"] == pytest.approx(35.0)
    assert (agent["slo_p95_ms"], agent["breach_days"], agent["breached"]) == (100, 1, True)
    # Agents without an SLO are never flagged.
    assert not any(a["breached"] for a in report["agents"] if a["agent_id"] != "acct-slo")
    out = (await cli(seeded, "report", "slo", *window())).stdout
    breaches = [line for line in out.splitlines() if line.startswith("BREACH")]
    assert len(breaches) == 1
    assert breaches[0].startswith(f"BREACH acct-slo {over}: p95")


async def test_hashed_agent_ids_are_stable_and_not_the_raw_ids(seeded: str,
                                                               tmp_path: Path) -> None:
    key_file = tmp_path / "agent-hash.key"
    key_file.write_bytes(KEY + b"\n")
    raw = {"acct-a", "acct-b", "acct-spiky", "acct-slo"}
    runs = []
    for _ in range(2):
        out = (await cli(seeded, "report", "costs", "--json", "--hash-key-file", str(key_file),
                         *window())).stdout
        runs.append(json.loads(out))
        assert not any(agent in out for agent in raw)
    ids = [{a["agent_id"] for a in run["agents"]} for run in runs]
    assert ids[0] == ids[1]
    assert ids[0] == {agent_hasher(KEY)(agent) for agent in raw}
    assert runs[0]["hashed_agents"] is True
    # The same key from the environment gives the same names; another key other names.
    by_env = json.loads((await cli(seeded, "report", "slo", "--json", "--hash-agents",
                                   *window(), env={"AGENT_HASH_KEY": KEY.decode()})).stdout)
    assert {a["agent_id"] for a in by_env["agents"]} <= ids[0]
    other = json.loads((await cli(seeded, "report", "costs", "--json", "--hash-agents",
                                  *window(), env={"AGENT_HASH_KEY": "x" * 32})).stdout)
    assert not {a["agent_id"] for a in other["agents"]} & ids[0]
    # Asked to hash without a key: refused, nothing printed.
    refused = await cli(seeded, "report", "costs", "--json", "--hash-agents", *window(),
                        code=2)
    assert refused.stdout == ""
