"""Per-agent policy end to end (ADR-0006): `intentroute agent set/show` as a user runs
them, running workers picking a change up without a restart, and what the policy
decides: a borderline message's routing, a failing backend's answer."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from shared.contracts.response import ChunkKind
from shared.policy.agent import AgentPolicy, ClarityPolicy, Price
from shared.store import asyncpg_dsn
from shared.store.policies import load_policy, save_policy
from tests.helpers.agents import Connections, add_agents
from tests.helpers.pipeline import ask_all, base_env, make_request, running

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent.parent
AGENTS = {"pol-ask": True, "pol-plain": True, "pol-ide": True, "pol-chat": True,
          "pol-both": True}
# Issue 14: a running worker follows `agent set` within 30 s, without a restart.
PICKUP_BOUND = 30.0
# Layer 2 (the shipped head) is unsure of it: ~0.69, between the global clarity
# threshold (0.65) and the decide threshold (0.85).
BORDERLINE = "is it possible"


@pytest.fixture(scope="module")
async def policy_agents(nats_url: str, database_url: str) -> AsyncIterator[dict[str, Any]]:
    creds = await add_agents(nats_url, database_url, AGENTS)
    yield creds
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        await conn.execute("DELETE FROM agent_policies WHERE agent_id = ANY($1::text[])",
                           list(AGENTS))
    finally:
        await conn.close()


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    yield conn
    await conn.close()


@pytest.fixture
async def connect_policy_agent(
    nats_url: str, policy_agents: dict[str, Any]
) -> AsyncIterator[Any]:
    connect = Connections(nats_url, policy_agents)
    yield connect
    await connect.close()


async def logged(db: asyncpg.Connection, agent: str, request_id: str) -> asyncpg.Record:
    """The request's log row; an error answer's row is written just after its final
    chunk went out, so it may take a moment."""
    deadline = time.monotonic() + 10
    while True:
        row = await db.fetchrow(
            "SELECT outcome, model, answered_by, fallback, fallback_reason, tokens_in, "
            "tokens_out, tokens_note FROM request_log WHERE agent_id = $1 "
            "AND request_id = $2", agent, request_id)
        if row is not None or time.monotonic() > deadline:
            return row
        await asyncio.sleep(0.05)


def cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "intentroute.cli", *args], env=env,
                          capture_output=True, text=True, timeout=60)


async def run_cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(cli, database_url, *args)


async def test_agent_set_validates_saves_and_prints_the_policy_and_show_reads_it(
    database_url: str, policy_agents: dict[str, Any], db: asyncpg.Connection
) -> None:
    res = await run_cli(database_url, "agent", "set", "pol-both", "clarity_threshold=0.75",
                        "clarity_policy=ask", "fallback.main=qwen2.5:0.5b,error",
                        "slo_p95_ms=500", "price.qwen2.5:0.5b=0.01,0.02,0.5")
    assert res.returncode == 0, res.stderr
    printed = json.loads(res.stdout)
    assert printed == {"clarity_policy": "ask", "clarity_threshold": 0.75,
                       "fallback": {"main": ["qwen2.5:0.5b", "error"]}, "slo_p95_ms": 500.0,
                       "prices": {"qwen2.5:0.5b": {"input_per_1k": 0.01, "output_per_1k": 0.02,
                                                   "per_compute_s": 0.5}}}
    assert await load_policy(db, "pol-both") == AgentPolicy(
        clarity_threshold=0.75, clarity_policy=ClarityPolicy.ASK,
        fallback={"main": ["qwen2.5:0.5b", "error"]}, slo_p95_ms=500.0,
        prices={"qwen2.5:0.5b": Price(0.01, 0.02, 0.5)})
    shown = await run_cli(database_url, "agent", "show", "pol-both")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == printed

    # One refused assignment: nothing changes, the reason is printed, exit status 1.
    bad = await run_cli(database_url, "agent", "set", "pol-both", "clarity_threshold=0.5",
                        "clarity_policy=maybe")
    assert bad.returncode == 1
    assert "clarity_policy" in bad.stderr
    assert "'maybe'" in bad.stderr
    assert (await load_policy(db, "pol-both")).clarity_threshold == 0.75

    # An empty value unsets a key.
    unset = await run_cli(database_url, "agent", "set", "pol-both", "clarity_threshold=",
                          "fallback.main=")
    assert json.loads(unset.stdout) == {k: v for k, v in printed.items()
                                        if k not in ("clarity_threshold", "fallback")}


async def test_agent_set_and_show_refuse_an_unknown_agent(
    database_url: str, db: asyncpg.Connection
) -> None:
    for args in (("set", "nobody-here", "clarity_policy=ask"), ("show", "nobody-here")):
        res = await run_cli(database_url, "agent", *args)
        assert res.returncode == 1
        assert "no agent 'nobody-here'" in res.stderr
        assert res.stdout == ""
    assert await db.fetchval(
        "SELECT count(*) FROM agent_policies WHERE agent_id = 'nobody-here'") == 0


async def test_a_running_classifier_follows_agent_set_within_30_s(
    nats_url: str, database_url: str, kb_index: Path, connect_policy_agent: Any,
    db: asyncpg.Connection,
) -> None:
    """A borderline message (confidence ~0.69) goes on with the best guess; after
    `agent set pol-ask clarity_threshold=0.8 clarity_policy=ask` the running classifier
    (default POLICY_REFRESH) asks that agent back, and only that agent."""
    await db.execute("DELETE FROM agent_policies WHERE agent_id = 'pol-ask'")
    asker, plain = await connect_policy_agent("pol-ask"), await connect_policy_agent("pol-plain")
    env = base_env(nats_url, database_url, kb_index)  # POLICY_REFRESH: the default
    async with running(env, ("gateway", "classifier", "generator-conversational",
                             "retriever", "generator-main")):
        before = await ask_all(asker, make_request(BORDERLINE, agent_id="pol-ask"))
        decision = before[-1].decision
        assert decision is not None
        assert decision.clarity == "needs_confirmation"
        assert before[-1].kind == ChunkKind.FINAL
        assert before[-1].error is None

        res = await run_cli(database_url, "agent", "set", "pol-ask", "clarity_threshold=0.8",
                            "clarity_policy=ask")
        assert res.returncode == 0, res.stderr
        changed = time.monotonic()
        while True:
            chunks = await ask_all(asker, make_request(BORDERLINE, agent_id="pol-ask"))
            if chunks[-1].kind == ChunkKind.CLARIFICATION:
                break
            assert time.monotonic() - changed < PICKUP_BOUND, "policy not picked up"
            await asyncio.sleep(0.25)
        pickup = time.monotonic() - changed
        print(f"\npolicy pickup by the running classifier: {pickup:.2f} s")
        clarified = chunks[-1].decision
        assert clarified is not None
        assert clarified.clarity == "needs_clarification"
        other = await ask_all(plain, make_request(BORDERLINE, agent_id="pol-plain"))
    assert other[-1].kind == ChunkKind.FINAL
    assert other[-1].decision is not None
    assert other[-1].decision.clarity == "needs_confirmation"
    assert pickup < PICKUP_BOUND


async def test_the_agents_fallback_chain_decides_what_a_failing_backends_request_gets(
    nats_url: str, database_url: str, kb_index: Path, connect_policy_agent: Any,
    db: asyncpg.Connection, fake_ollama: Any,
) -> None:
    """The conversational model is gone: the IDE agent (chain: extractive) gets the
    extractive answer, the chat agent (chain: error) an explicit error; a chain naming
    another model is answered by that model."""
    await save_policy(db, "pol-ide", AgentPolicy(fallback={"conversational": ["extractive"]}))
    await save_policy(db, "pol-chat", AgentPolicy(fallback={"conversational": ["error"]}))
    await save_policy(db, "pol-both", AgentPolicy(
        fallback={"conversational": ["big:1.7b", "error"]}))
    fake_ollama.missing = {"small:0.6b"}
    env = base_env(nats_url, database_url, kb_index, OLLAMA_HOST=fake_ollama.url,
                   OLLAMA_MODEL_NAME="big:1.7b", OLLAMA_MODEL_NAME_CONVERSATIONAL="small:0.6b")
    finals, rows = {}, {}
    async with running(env, ("gateway", "classifier", "generator-conversational")):
        for agent in ("pol-ide", "pol-chat", "pol-both"):
            nc = await connect_policy_agent(agent)
            req = make_request("how is my quota?", agent_id=agent, query_type="PLATFORM",
                               extra_context="calls_used=400 monthly_calls=2000")
            finals[agent] = (await ask_all(nc, req))[-1]
            rows[agent] = await logged(db, agent, req.request_id)

    ide, chat, both = finals["pol-ide"], finals["pol-chat"], finals["pol-both"]
    assert ide.error is None
    assert ide.answered_by == "extractive"
    assert "calls_used=400" in ide.text
    assert chat.error is not None
    assert chat.error.code == "BACKEND_UNAVAILABLE"
    assert both.error is None
    assert both.answered_by == "ollama/big:1.7b"
    assert dict(rows["pol-ide"]) == {
        "outcome": "ok", "model": "extractive", "answered_by": "extractive", "fallback": True,
        "fallback_reason": "refused ollama/small:0.6b", "tokens_in": 0, "tokens_out": 0,
        "tokens_note": "extractive"}
    assert dict(rows["pol-chat"]) == {
        "outcome": "error:BACKEND_UNAVAILABLE", "model": "", "answered_by": "",
        "fallback": True, "fallback_reason": "refused ollama/small:0.6b", "tokens_in": 0,
        "tokens_out": 0, "tokens_note": ""}
    (_, prompt, completion), = [r for r in fake_ollama.reported if r[0] == "big:1.7b"]
    assert dict(rows["pol-both"]) == {
        "outcome": "ok", "model": "ollama/big:1.7b", "answered_by": "ollama/big:1.7b",
        "fallback": True, "fallback_reason": "refused ollama/small:0.6b", "tokens_in": prompt,
        "tokens_out": completion, "tokens_note": ""}
    assert fake_ollama.models == ["small:0.6b", "small:0.6b", "small:0.6b", "big:1.7b"]
