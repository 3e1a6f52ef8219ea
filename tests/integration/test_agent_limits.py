"""Per-agent limits end to end on real NATS and Postgres: each limit refuses with its
typed final chunk on NATS (and RESOURCE_EXHAUSTED with a retry-after trailer on gRPC),
every refusal is in the request log, and a budget holds across two gateway replicas
with concurrent requests, streamed and collected answers counted alike; `degrade`
answers are marked. (The arithmetic of each window, on a fake clock, is
test_limit_state.py.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import pytest

from services.gateway.limits.store import budget_overshoot
from shared.contracts.codec import decode_chunk
from shared.contracts.response import ErrorCode, ResponseChunk
from shared.grpc import agent_pb2, agent_pb2_grpc
from shared.policy.agent import AgentPolicy, OnBudget, Price
from shared.store import asyncpg_dsn
from shared.store.policies import save_policy
from tests.helpers.agents import Connections, add_agents
from tests.helpers.pipeline import ask_all, base_env, make_request, running

pytestmark = pytest.mark.integration

MODEL = "big:1.7b"
# One cost unit per output token; every answer below is 4 pieces (4 tokens out): 4 units.
PRICES = {MODEL: Price(0.0, 1000.0, 0.0)}
POLICIES = {
    "lim-rate": AgentPolicy(rate=1 / 60, burst=2),
    "lim-conc": AgentPolicy(max_inflight=1),
    "lim-quota": AgentPolicy(tokens_per_min=10),
    "lim-budget": AgentPolicy(budget_day=20.0, prices=PRICES),
    "lim-degrade": AgentPolicy(budget_day=3.0, on_budget=OnBudget.DEGRADE, prices=PRICES),
    "lim-erase": AgentPolicy(budget_day=8.0, prices=PRICES),
    "lim-victim": AgentPolicy(),
}
WORKERS = ("gateway", "gateway", "classifier", "retriever", "generator-main",
           "generator-conversational", "validator", "doors")


def four_pieces(body: dict[str, Any]) -> list[str]:
    if "endpoint" in body["messages"][-1]["content"]:
        return ["```avap\n", "addVar(total, 0)\n", "addResult(total)\n", "```\n"]
    return ["Use ", "startLoop ", "to ", "count."]


@pytest.fixture(scope="module")
async def limit_agents(nats_url: str, database_url: str) -> AsyncIterator[dict[str, Any]]:
    creds = await add_agents(nats_url, database_url, dict.fromkeys(POLICIES, True))
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        await conn.execute("DELETE FROM agent_limit_state WHERE agent_id = ANY($1::text[])",
                           list(POLICIES))
        for agent, policy in POLICIES.items():
            await save_policy(conn, agent, policy)
        yield creds
        await conn.execute("DELETE FROM agent_policies WHERE agent_id = ANY($1::text[])",
                           list(POLICIES))
    finally:
        await conn.close()


@pytest.fixture
async def connect(nats_url: str, limit_agents: dict[str, Any]) -> AsyncIterator[Connections]:
    connections = Connections(nats_url, limit_agents)
    yield connections
    await connections.close()


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    yield conn
    await conn.close()


def env_for(nats_url: str, database_url: str, kb_index: Path, fake_ollama: Any,
            **extra: str) -> dict[str, str]:
    fake_ollama.responder = four_pieces
    return base_env(nats_url, database_url, kb_index, OLLAMA_HOST=fake_ollama.url,
                    OLLAMA_MODEL_NAME=MODEL, AVAP_PARSER_TIMEOUT="0", **extra)


async def outcome(db: asyncpg.Connection, agent: str, request_id: str) -> str:
    """The request's log row's outcome (a refusal's is written just after its chunk)."""
    for _ in range(100):
        found = await db.fetchval("SELECT outcome FROM request_log WHERE agent_id = $1 AND "
                                  "request_id = $2", agent, request_id)
        if found is not None:
            return str(found)
        await asyncio.sleep(0.05)
    raise AssertionError(f"no request-log row for {request_id}")


def final_of(chunks: list[ResponseChunk]) -> ResponseChunk:
    finals = [c for c in chunks if c.is_final]
    assert len(finals) == 1
    return finals[0]


async def test_rate_concurrency_and_quota_refusals_are_typed_final_chunks_and_logged(
    connect: Connections, nats_url: str, database_url: str, kb_index: Path,
    fake_ollama: Any, db: asyncpg.Connection, agent_tokens: dict[str, str],
    limit_agents: dict[str, Any]
) -> None:
    from intentroute.stack import free_port

    grpc_addr = f"127.0.0.1:{free_port()}"
    env = env_for(nats_url, database_url, kb_index, fake_ollama)
    async with running({**env, "GATEWAY_GRPC_LISTEN": grpc_addr}, WORKERS[1:]):
        # Rate: a bucket of 2, refilled one a minute.
        nc = await connect("lim-rate")
        asked = [make_request("how do I count?", agent_id="lim-rate",
                              query_type="RETRIEVAL") for _ in range(3)]
        finals = [final_of(await ask_all(nc, req)) for req in asked]
        assert [f.error for f in finals[:2]] == [None, None]
        refused = finals[2].error
        assert refused is not None
        assert refused.code == ErrorCode.RATE_LIMITED
        assert 0 < refused.retry_after_ms <= 60_000
        assert await outcome(db, "lim-rate", asked[2].request_id) == "error:RATE_LIMITED"
        # The same refusal on gRPC: RESOURCE_EXHAUSTED with the retry-after trailers.
        async with grpc.aio.insecure_channel(grpc_addr) as channel:
            stub = agent_pb2_grpc.AssistanceEngineStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await stub.AskAgent(
                    agent_pb2.AgentRequest(query="how do I count?", session_id="g1"),
                    metadata=(("authorization", f"Bearer {limit_agents['lim-rate'].token}"),))
        assert failed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert ErrorCode.RATE_LIMITED in (failed.value.details() or "")
        trailers = dict(failed.value.trailing_metadata() or ())
        assert 0 < int(trailers["retry-after"]) <= 60
        assert 0 < int(trailers["retry-after-ms"]) <= 60_000

        # In flight: one at a time; the second, asked while the first streams, is refused.
        fake_ollama.token_delay = 0.3
        fake_ollama.first_token_sent.clear()
        nc = await connect("lim-conc")
        slow, second = (make_request("how do I count?", agent_id="lim-conc",
                                     query_type="RETRIEVAL") for _ in range(2))
        first_task = asyncio.create_task(ask_all(nc, slow))
        await fake_ollama.first_token_sent.wait()
        concurrent = final_of(await ask_all(nc, second))
        assert concurrent.error is not None
        assert concurrent.error.code == ErrorCode.CONCURRENCY_LIMITED
        assert final_of(await first_task).error is None
        fake_ollama.token_delay = 0.0
        # Once its row is written the first no longer counts: the next one is answered.
        again = make_request("how do I count?", agent_id="lim-conc", query_type="RETRIEVAL")
        assert final_of(await ask_all(nc, again)).error is None
        assert await outcome(db, "lim-conc", second.request_id) == "error:CONCURRENCY_LIMITED"

        # Tokens a minute: one answer reports more than 10 (prompt + 4 out).
        nc = await connect("lim-quota")
        first, over = (make_request("how do I count?", agent_id="lim-quota",
                                    query_type="RETRIEVAL") for _ in range(2))
        assert final_of(await ask_all(nc, first)).error is None
        quota = final_of(await ask_all(nc, over)).error
        assert quota is not None
        assert quota.code == ErrorCode.QUOTA_EXCEEDED
        assert 0 < quota.retry_after_ms <= 120_000
        assert await outcome(db, "lim-quota", over.request_id) == "error:QUOTA_EXCEEDED"


async def test_a_budget_holds_across_two_gateways_streamed_and_collected_alike(
    connect: Connections, nats_url: str, database_url: str, kb_index: Path,
    fake_ollama: Any, db: asyncpg.Connection
) -> None:
    env = env_for(nats_url, database_url, kb_index, fake_ollama)
    fake_ollama.token_delay = 0.05
    async with running(env, WORKERS):
        nc = await connect("lim-budget")
        # One streamed (RETRIEVAL) and one collected (CODE_GENERATION) answer first, so
        # both kinds are paid for whichever of the burst is admitted (which ones win is
        # a race); their cost (4) becomes the estimate reserved for each later one.
        for query_type, text in (("RETRIEVAL", "how do I count?"),
                                 ("CODE_GENERATION", "write an endpoint that returns a total")):
            warm = make_request(text, agent_id="lim-budget", query_type=query_type)
            assert final_of(await ask_all(nc, warm)).error is None
        # 12 at once, both kinds mixed, taken by either gateway: 8 spent + 4 reserved
        # each <= 20 admits 3 of them.
        burst = [make_request("write an endpoint that returns a total" if i % 2 else
                              "how do I count?", agent_id="lim-budget",
                              query_type="CODE_GENERATION" if i % 2 else "RETRIEVAL")
                 for i in range(12)]
        finals = [final_of(chunks) for chunks in
                  await asyncio.gather(*(ask_all(nc, req) for req in burst))]
        answered = [f for f in finals if f.error is None]
        refused = [f for f in finals if f.error is not None]
        # 3 when every answer costs its estimate; a model step that times out on a loaded
        # machine answers extractively at cost 0, which lowers the estimate (more fit).
        assert len(answered) >= 3
        assert refused
        assert {f.error.code for f in refused if f.error} == {ErrorCode.BUDGET_EXCEEDED}
        assert all(f.error and f.error.retry_after_ms > 0 for f in refused)
        # Settled: the day's spend is past nothing but its bound; everything is refused.
        late = make_request("how do I count?", agent_id="lim-budget", query_type="RETRIEVAL")
        late_final = final_of(await ask_all(nc, late))
        assert late_final.error is not None
        assert late_final.error.code == ErrorCode.BUDGET_EXCEEDED
    rows = await db.fetch("SELECT query_type, outcome, model, tokens_out FROM request_log "
                          "WHERE agent_id = 'lim-budget'")
    ok = [r for r in rows if r["outcome"] == "ok" and r["model"] == f"ollama/{MODEL}"]
    assert {r["query_type"] for r in ok} == {"RETRIEVAL", "CODE_GENERATION"}
    assert all(r["tokens_out"] == 4 for r in ok)  # both kinds counted as reported
    assert sum(r["outcome"] == "error:BUDGET_EXCEEDED" for r in rows) == len(refused) + 1
    day = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    read = await budget_overshoot(db, "lim-budget", budget=20.0,
                                  prices={MODEL: [0.0, 1000.0, 0.0]}, since=day,
                                  until=day + timedelta(days=1))
    assert read["spent"] == 4.0 * len(ok)  # what the log says, priced
    assert read["spent"] >= 20.0
    assert read["overshoot"] <= read["bound"]


async def test_degrade_answers_past_the_budget_with_the_extractive_answerer_marked(
    connect: Connections, nats_url: str, database_url: str, kb_index: Path,
    fake_ollama: Any, db: asyncpg.Connection
) -> None:
    env = env_for(nats_url, database_url, kb_index, fake_ollama)
    async with running(env, WORKERS[1:]):
        nc = await connect("lim-degrade")
        paid = make_request("how do I count?", agent_id="lim-degrade", query_type="RETRIEVAL")
        assert final_of(await ask_all(nc, paid)).answered_by == f"ollama/{MODEL}"
        calls = len(fake_ollama.reported)
        for query_type in ("RETRIEVAL", "CODE_GENERATION"):
            past = make_request("write an endpoint that returns a total", agent_id="lim-degrade",
                                query_type=query_type)
            final = final_of(await ask_all(nc, past))
            assert final.error is None
            assert final.answered_by == "extractive:budget"
            row = await db.fetchrow("SELECT outcome, model, answered_by, tokens_out FROM "
                                    "request_log WHERE agent_id = 'lim-degrade' AND "
                                    "request_id = $1", past.request_id)
            assert dict(row) == {"outcome": "ok", "model": "extractive",
                                 "answered_by": "extractive:budget", "tokens_out": 0}
        assert len(fake_ollama.reported) == calls  # no model was asked


async def _resend_id(nc: Any, agent: str, request_id: str) -> ResponseChunk:
    """The bill-erasing trick: `{"request_id": R}` published again on the agent's own
    request subject; returns the gateway's answer to it (on the agent's `_invalid`)."""
    invalid = await nc.subscribe(f"agent.response.{agent}._invalid")
    await nc.flush()
    await nc.jetstream().publish(f"agent.request.{agent}",
                                 json.dumps({"request_id": request_id}).encode())
    chunk = decode_chunk((await invalid.next_msg(timeout=10)).data)
    await invalid.unsubscribe()
    return chunk


async def test_a_resent_request_id_erases_no_bill_and_escapes_no_budget(
    connect: Connections, nats_url: str, database_url: str, kb_index: Path,
    fake_ollama: Any, db: asyncpg.Connection
) -> None:
    """After each answer the agent publishes `{"request_id": R}` again (before, the
    gateway's MISSING_FIELD row overwrote the answered one: model empty, compute 0, and
    a budget of 2 answers let 40 of 40 through). Now the resend names an
    admitted id: answered on `_invalid`, logged as its own row; the answered rows keep
    their bill and the budget refuses the third answer as without the trick."""
    env = env_for(nats_url, database_url, kb_index, fake_ollama)
    async with running(env, WORKERS[1:]):
        nc = await connect("lim-erase")
        finals = []
        for _ in range(5):
            req = make_request("how do I count?", agent_id="lim-erase", query_type="RETRIEVAL")
            chunks = await ask_all(nc, req)
            finals.append(final_of(chunks))
            refusal = await _resend_id(nc, "lim-erase", req.request_id)
            assert refusal.request_id == req.request_id
            assert refusal.error is not None
            assert refusal.error.code == ErrorCode.MISSING_FIELD
        answered = [f for f in finals if f.error is None]
        assert len(answered) == 2  # 8 units a day, 4 an answer: as without the trick
        assert {f.error.code for f in finals if f.error} == {ErrorCode.BUDGET_EXCEEDED}
        # Another agent's id, sent on the attacker's own subject, is the attacker's own
        # (new) id: the victim's row and answer subject are untouched.
        victim = await connect("lim-victim")
        theirs = make_request("how do I count?", agent_id="lim-victim", query_type="RETRIEVAL")
        assert final_of(await ask_all(victim, theirs)).error is None
        await nc.jetstream().publish("agent.request.lim-erase",
                                     json.dumps({"request_id": theirs.request_id}).encode())
        await asyncio.sleep(0.5)
    rows = await db.fetch("SELECT request_id, outcome, model, tokens_out FROM request_log "
                          "WHERE agent_id = 'lim-erase' ORDER BY created_at")
    by_id: dict[str, list[str]] = {}
    for row in rows:
        by_id.setdefault(row["request_id"], []).append(row["outcome"])
    billed = [r for r in rows if r["outcome"] == "ok"]
    assert len(billed) == 2
    assert all(r["model"] == f"ollama/{MODEL}" and r["tokens_out"] == 4 for r in billed)
    # Each answered id: its answer's row, then the resend's row of its own.
    assert sorted(v for r in billed for v in by_id[r["request_id"]]) == sorted(
        ["ok", "error:MISSING_FIELD"] * 2)
    victim_rows = await db.fetch("SELECT outcome, model FROM request_log WHERE agent_id = "
                                 "'lim-victim'")
    assert [(r["outcome"], r["model"]) for r in victim_rows] == [("ok", f"ollama/{MODEL}")]
