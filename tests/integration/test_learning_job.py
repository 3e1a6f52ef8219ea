"""The learning job on real Postgres with a clock the test moves: proposals fitted on the
logged traffic of agents whose truth is known, observe mode, the A/B share of live
traffic (served with `effective_policy` as a worker would), promotion and rejection;
the advisory lock; LEARN_INTERVAL in the learner worker; `intentroute learn`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from shared.learning.job import LearnLoop, Phase, default_phases, learn_once, run_job
from shared.learning.settings import LearnSettings
from shared.policy.ab import arm_sql, in_ab_arm, load_candidates
from shared.policy.agent import AgentPolicy, ClarityPolicy, apply_assignment
from shared.store.policies import load_policy, save_policy
from testkit.clocks import ManualUtcClock
from tests.helpers.learning import (
    Truth,
    ab_policy,
    fresh_database,
    simulate,
    store_traffic,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent.parent
SETTINGS = LearnSettings()
ASKING = AgentPolicy(clarity_policy=ClarityPolicy.ASK, clarity_threshold=0.65)


@pytest.fixture
async def learn_db(database_url: str) -> AsyncIterator[str]:
    async with fresh_database(database_url) as url:
        yield url


@pytest.fixture
async def conn(learn_db: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(learn_db)
    yield connection
    await connection.close()


async def seed_history(conn: asyncpg.Connection, clock: ManualUtcClock, agent: str, truth: Truth,
                       policy: AgentPolicy, *, n: int = 3000, seed: int = 1) -> None:
    """30 days of an agent's traffic served with `policy`, which is then its policy."""
    traffic = simulate(agent, truth, n, start=clock.now - _days(30), end=clock.now,
                       policy_for=lambda _: policy, seed=seed)
    await store_traffic(conn, traffic)
    await save_policy(conn, agent, policy)


async def seed_live(conn: asyncpg.Connection, clock: ManualUtcClock, agent: str, truth: Truth, *,
                    days: float, n: int, seed: int) -> None:
    """`days` of live traffic: the base policy, or the candidate for its A/B arm."""
    serve = ab_policy(agent, await load_policy(conn, agent), await load_candidates(conn))
    traffic = simulate(agent, truth, n, start=clock.now, end=clock.now + _days(days),
                       policy_for=serve, seed=seed)
    await store_traffic(conn, traffic)
    clock.advance(days=days)


def _days(n: float) -> Any:
    from datetime import timedelta

    return timedelta(days=n)


async def learn(conn: asyncpg.Connection, clock: ManualUtcClock) -> dict[str, Any]:
    summary = await run_job(conn, default_phases(SETTINGS), clock)
    assert summary["ok"], summary
    return summary


async def proposals(conn: asyncpg.Connection, agent: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT id, key, value::text AS value, status, reason, figures::text AS figures, "
        "ab_started_at, share FROM learning_proposals WHERE agent_id = $1 ORDER BY id", agent)


async def seed_threshold_world(conn: asyncpg.Connection, clock: ManualUtcClock) -> None:
    """"ide" asks below 0.65; its users rate a clarifying question a success 35% of the
    time, and an answer at confidence c a success with probability c: asking below
    ~0.35 is best. "pool" always answers (the evidence of what answering unsure
    messages is worth)."""
    await seed_history(conn, clock, "ide", Truth(), ASKING, seed=1)
    await seed_history(conn, clock, "pool", Truth(), AgentPolicy(), seed=2)


async def test_the_job_promotes_a_better_clarity_threshold_after_its_ab_share(
    conn: asyncpg.Connection,
) -> None:
    clock = ManualUtcClock()
    await seed_threshold_world(conn, clock)

    summary = await learn(conn, clock)
    (proposal,) = await proposals(conn, "ide")
    proposed = json.loads(proposal["value"])
    assert proposal["key"] == "clarity_threshold"
    assert 0.30 <= proposed <= 0.45
    assert proposal["status"] == "ab"
    assert proposal["share"] == pytest.approx(0.1)
    assert summary["phases"]["observe"]["to_ab"] == 1
    assert not await proposals(conn, "pool")  # it never asks: no threshold to tune
    candidates = await load_candidates(conn)
    assert candidates["ide"][0].clarity_threshold == proposed

    # Too few requests in the arm yet: the A/B keeps running.
    await seed_live(conn, clock, "ide", Truth(), days=0.2, n=300, seed=3)
    summary = await learn(conn, clock)
    assert summary["phases"]["ab"]["running"] == 1

    await seed_live(conn, clock, "ide", Truth(), days=3, n=4000, seed=4)
    summary = await learn(conn, clock)
    (decided,) = summary["phases"]["ab"]["decided"]
    assert decided["status"] == "promoted"
    assert decided["arm_n"] >= SETTINGS.ab_min_requests
    assert decided["arm_rate"] > decided["control_rate"]
    (proposal,) = await proposals(conn, "ide")
    assert proposal["status"] == "promoted"
    assert json.loads(proposal["figures"])["ab"]["arm_rate"] == decided["arm_rate"]
    policy = await load_policy(conn, "ide")
    assert policy.clarity_threshold == proposed
    assert policy.clarity_policy == "ask"
    assert await load_candidates(conn) == {}


async def test_the_job_refuses_a_setting_that_is_worse_on_live_traffic(
    conn: asyncpg.Connection,
) -> None:
    """The log says answering more unsure messages pays, so the proposal passes observe
    mode; but the answers have since got worse (a degraded model): the A/B arm does
    worse than the rest of the agent's traffic and the setting is refused."""
    clock = ManualUtcClock()
    await seed_threshold_world(conn, clock)
    await learn(conn, clock)
    (proposal,) = await proposals(conn, "ide")
    assert proposal["status"] == "ab"

    degraded = Truth(answer=lambda c: max(0.0, c - 0.35) if c < 0.65 else c)
    await seed_live(conn, clock, "ide", degraded, days=3, n=4000, seed=5)
    summary = await learn(conn, clock)
    (decided,) = summary["phases"]["ab"]["decided"]
    assert decided["status"] == "rejected"
    assert decided["arm_rate"] < decided["control_rate"]
    (proposal,) = await proposals(conn, "ide")
    assert proposal["status"] == "rejected"
    assert proposal["reason"].startswith("A/B: ")
    assert (await load_policy(conn, "ide")).clarity_threshold == 0.65

    # The job leaves the agent's threshold alone while LEARN_RETRY_DAYS runs.
    summary = await learn(conn, clock)
    assert summary["phases"]["propose"]["proposed"] == 0
    assert len(await proposals(conn, "ide")) == 1


async def test_observe_mode_blocks_a_clearly_worse_proposal_before_any_ab(
    conn: asyncpg.Connection,
) -> None:
    """An operator's proposal to ask on every unsure message: replayed over the log, the
    decisions it turns from answers into questions lose value, so it never reaches A/B."""
    clock = ManualUtcClock()
    await seed_threshold_world(conn, clock)
    await conn.execute(
        "INSERT INTO learning_proposals (agent_id, key, value, status, origin, created_at) "
        "VALUES ('ide', 'clarity_threshold', '0.85', 'observe', 'operator', $1)", clock.now)

    summary = await learn(conn, clock)
    assert summary["phases"]["observe"] == {"seconds": summary["phases"]["observe"]["seconds"],
                                            "evaluated": 1, "to_ab": 0, "rejected": 1,
                                            "waiting": 0}
    (proposal,) = await proposals(conn, "ide")
    assert proposal["status"] == "rejected"
    assert proposal["reason"].startswith("observe: ")
    assert proposal["ab_started_at"] is None
    replay = json.loads(proposal["figures"])["observe"]
    assert replay["proposed"]["rate"] < replay["current"]["rate"] - 0.05
    assert replay["proposed"]["changed"] > 0
    assert await load_candidates(conn) == {}
    assert (await load_policy(conn, "ide")).clarity_threshold == 0.65


async def test_the_job_reorders_a_fallback_chain_by_the_agents_success(
    conn: asyncpg.Connection,
) -> None:
    """"chat" used both models; m-big succeeds for it 90% of the time, m-small 60%, yet
    its chain puts m-small first: the job proposes m-big first and promotes it."""
    clock = ManualUtcClock()
    truth = Truth(answer=lambda c: 1.0, models={"m-big": 0.9, "m-small": 0.6})
    await seed_history(conn, clock, "chat", truth, AgentPolicy(), seed=6)
    small_first = apply_assignment(AgentPolicy(), "fallback.main=m-small,m-big,error")
    await save_policy(conn, "chat", small_first)

    await learn(conn, clock)
    (proposal,) = await proposals(conn, "chat")
    assert proposal["key"] == "fallback.main"
    assert json.loads(proposal["value"]) == ["m-big", "m-small", "error"]
    assert proposal["status"] == "ab"

    await seed_live(conn, clock, "chat", truth, days=3, n=4000, seed=7)
    await learn(conn, clock)
    (proposal,) = await proposals(conn, "chat")
    assert proposal["status"] == "promoted", proposal["reason"]
    assert (await load_policy(conn, "chat")).fallback["main"] == ["m-big", "m-small", "error"]


async def test_a_requests_value_is_its_feedback_else_what_the_log_knows(
    conn: asyncpg.Connection,
) -> None:
    from shared.learning.slices import load_slices

    clock = ManualUtcClock()
    # (outcome, fallback, validation_status, feedback (outcome, source) or None, value)
    cases = [
        ("ok", False, "", None, 1.0),
        ("ok", True, "", None, 0.0),
        ("error:STAGE_FAILED", False, "", None, 0.0),
        ("ok", False, "INVALID_UNRESOLVED", None, 0.0),
        ("ok", False, "", ("user_rejected", "explicit"), 0.0),
        ("error:STAGE_FAILED", False, "", ("success", "explicit"), 1.0),
        ("clarification", False, "", None, 0.5),
        ("clarification", False, "", ("fallback", "implicit"), 0.5),
        ("clarification", False, "", ("success", "explicit"), 1.0),
    ]
    for i, (outcome, fallback, validation, feedback, _) in enumerate(cases):
        await conn.execute(
            "INSERT INTO request_log (agent_id, request_id, session_id, outcome, fallback, "
            "validation_status, layer, confidence, model_slot, created_at) "
            "VALUES ('v', $1, 's', $2, $3, $4, 'llm', 0.5, 'main', $5)",
            f"r{i}", outcome, fallback, validation, clock.now - _days(1))
        if feedback:
            await conn.execute(
                "INSERT INTO feedback (agent_id, request_id, outcome, source) "
                "VALUES ('v', $1, $2, $3)", f"r{i}", *feedback)
    slices = await load_slices(conn, clock.now - _days(30), clock.now, ask_value=0.5)
    agent = slices["v"]
    assert agent.requests == len(cases)
    assert agent.asked
    gates = agent.both.gates
    assert gates[(50, True)].n == 3
    assert gates[(50, True)].v == pytest.approx(2.0)
    assert gates[(50, False)].v == pytest.approx(sum(c[-1] for c in cases) - 2.0)


async def test_a_messages_value_counts_the_verdicts_on_its_parts(
    conn: asyncpg.Connection,
) -> None:
    """A message answered part by part is worth nothing when a part was judged a
    failure, unless the agent judged the whole message (scores rank them alike)."""
    from shared.learning.slices import load_slices

    clock = ManualUtcClock()
    # (verdicts on its parts, verdict on the whole message or None, value)
    cases = [
        (["success", "success"], None, 1.0),
        (["success", "user_rejected"], None, 0.0),
        (["user_rejected"], "success", 1.0),
    ]
    for i, (parts, whole, _) in enumerate(cases):
        await conn.execute(
            "INSERT INTO request_log (agent_id, request_id, session_id, outcome, query_type, "
            "layer, confidence, model_slot, created_at) "
            "VALUES ('m', $1, 's', 'ok', 'RET+CODE', 'llm', 0.5, 'main', $2)",
            f"r{i}", clock.now - _days(1))
        verdicts = [(f"r{i}#{k + 1}", outcome) for k, outcome in enumerate(parts)]
        verdicts += [(f"r{i}", whole)] if whole else []
        for request_id, outcome in verdicts:
            await conn.execute(
                "INSERT INTO feedback (agent_id, request_id, outcome, source) "
                "VALUES ('m', $1, $2, 'explicit')", request_id, outcome)
    slices = await load_slices(conn, clock.now - _days(30), clock.now, ask_value=0.5)
    agent = slices["m"]
    assert agent.requests == len(cases)  # the part verdicts are no requests of their own
    assert agent.both.gates[(50, False)].v == pytest.approx(sum(c[-1] for c in cases))


async def test_the_ab_arm_in_sql_is_the_arm_in_python(conn: asyncpg.Connection) -> None:
    ids = [f"req-{i}" for i in range(3000)]
    rows = await conn.fetch(
        f"SELECT r.request_id, {arm_sql('r.agent_id', 'r.request_id')} < 0.1 AS arm "
        "FROM (SELECT 'agent-x'::text AS agent_id, unnest($1::text[]) AS request_id) r", ids)
    assert {r["request_id"]: r["arm"] for r in rows} == {
        rid: in_ab_arm("agent-x", rid, 0.1) for rid in ids}
    assert 240 <= sum(r["arm"] for r in rows) <= 360


async def test_the_advisory_lock_lets_one_run_at_a_time(learn_db: str) -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(db: asyncpg.Connection, clock: Any) -> dict[str, Any]:
        entered.set()
        await release.wait()
        return {"held": True}

    def phases(_: LearnSettings) -> list[Phase]:
        return [Phase("slow", slow)]

    first = asyncio.create_task(learn_once(learn_db, SETTINGS, phases=phases))
    await asyncio.wait_for(entered.wait(), 10)
    second = await learn_once(learn_db, SETTINGS, phases=phases)
    assert second["ran"] is False
    release.set()
    summary = await first
    assert summary["ran"]
    assert summary["phases"]["slow"]["held"]
    assert (await learn_once(learn_db, SETTINGS, phases=phases))["ran"] is True


async def test_a_failing_phase_is_recorded_and_the_rest_still_run(learn_db: str) -> None:
    async def broken(db: asyncpg.Connection, clock: Any) -> dict[str, Any]:
        raise RuntimeError("boom")

    def phases(settings: LearnSettings) -> list[Phase]:
        return [Phase("broken", broken), *default_phases(settings)]

    summary = await learn_once(learn_db, SETTINGS, phases=phases)
    assert summary["ok"] is False
    assert summary["phases"]["broken"]["error"] == "RuntimeError: boom"
    assert summary["phases"]["ab"]["running"] == 0


async def test_learn_interval_runs_the_job_periodically(learn_db: str) -> None:
    runs: list[dict[str, Any]] = []
    two = asyncio.Event()

    def on_run(summary: dict[str, Any]) -> None:
        runs.append(summary)
        if len(runs) >= 2:
            two.set()

    loop = LearnLoop(learn_db, LearnSettings(interval=0.2), on_run=on_run)
    loop.start()
    try:
        await asyncio.wait_for(two.wait(), 20)
    finally:
        await loop.stop()
    assert all(run["ran"] and run["ok"] for run in runs)
    conn = await asyncpg.connect(learn_db)
    try:
        assert await conn.fetchval("SELECT count(*) FROM learning_runs") >= 2
    finally:
        await conn.close()


async def test_the_learner_worker_runs_the_job_every_learn_interval(
    nats_url: str, learn_db: str, tmp_path: Path,
) -> None:
    from tests.helpers.pipeline import base_env, running

    env = base_env(nats_url, learn_db, tmp_path, LEARN_INTERVAL="0.3")
    conn = await asyncpg.connect(learn_db)
    try:
        async with running(env, ("learner",)):
            for _ in range(200):
                if await conn.fetchval("SELECT count(*) FROM learning_runs") >= 2:
                    break
                await asyncio.sleep(0.1)
        count = await conn.fetchval("SELECT count(*) FROM learning_runs")
        summary = json.loads(await conn.fetchval(
            "SELECT summary::text FROM learning_runs ORDER BY id LIMIT 1"))
    finally:
        await conn.close()
    assert count >= 2
    # jsonb: unordered
    assert set(summary["phases"]) == {"rollups", "slices", "scores", "propose", "observe", "ab"}


def _cli(learn_db: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": learn_db, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "intentroute.cli", *args], env=env,
                          capture_output=True, text=True, timeout=60)


async def test_the_learn_command_prints_what_each_phase_did(learn_db: str) -> None:
    res = await asyncio.to_thread(_cli, learn_db, "learn", "propose", "ide",
                                  "clarity_threshold=0.8")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["status"] == "observe"
    bad = await asyncio.to_thread(_cli, learn_db, "learn", "propose", "ide", "slo_p95_ms=3")
    assert bad.returncode == 2
    assert "a proposal may set only" in bad.stderr

    res = await asyncio.to_thread(_cli, learn_db, "learn")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["ran"]
    assert summary["ok"]
    assert list(summary["phases"]) == ["rollups", "slices", "scores", "propose", "observe", "ab"]
    assert all("seconds" in figures for figures in summary["phases"].values())
    # No traffic to replay: the operator's proposal is rejected in observe mode.
    assert summary["phases"]["observe"]["rejected"] == 1

    res = await asyncio.to_thread(_cli, learn_db, "learn", "proposals", "--json")
    (row,) = json.loads(res.stdout)["proposals"]
    assert (row["agent_id"], row["key"], row["value"], row["status"]) == (
        "ide", "clarity_threshold", 0.8, "rejected")
    assert row["reason"] == "observe: no logged traffic in the window to replay"
