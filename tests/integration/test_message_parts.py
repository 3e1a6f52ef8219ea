"""A message carrying several requests, answered part by part on a real stack (NATS and
Postgres with authentication, every worker and the doors in-process, the generators on
the extractive answerer): on NATS the stream holds a marker per part and one final with
every part; the OpenAI door returns one message whose content has the parts in order
under their headings; gRPC likewise; the request log has one row for the message and
the intent history an entry per part; a verdict on one part lands on that part alone
(NATS, gRPC, HTTP), another agent's never."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import grpc
import openai
import pytest

from shared.client.caller import assemble, send_feedback
from shared.contracts.feedback import Feedback, FeedbackOutcome
from shared.contracts.response import ChunkKind
from shared.grpc import agent_pb2, agent_pb2_grpc
from shared.store import asyncpg_dsn
from shared.store.feedback_table import VERDICTS_SQL
from shared.store.scores import OUTCOME_SQL
from tests.helpers.agents import Connections, add_agents
from tests.helpers.pipeline import ask_all, base_env, door_addresses, make_request, running

pytestmark = pytest.mark.integration

WORKERS = ("gateway", "classifier", "retriever", "generator-main",
           "generator-conversational", "validator", "doors")
AGENT = "parts-a"
TWO = "how do I loop from 1 to 10 in AVAP? and then explain what addVar does"
THREE = ("explain addVar, then write an endpoint that returns a total; also, can you "
         "send me my last invoice?")
INVOICE = "invoice 2026-10: 12.40 EUR"


OTHER = "parts-b"


class Stack:
    def __init__(self, nc: Any, http: str, grpc_addr: str, token: str,
                 db: asyncpg.Connection, other: Any) -> None:
        self.nc, self.http, self.grpc_addr, self.token, self.db = nc, http, grpc_addr, token, db
        self.other = other  # another agent's connection


@pytest.fixture(scope="module")
async def parts_stack(nats_url: str, database_url: str, kb_index: Path) -> AsyncIterator[Stack]:
    creds = await add_agents(nats_url, database_url, {AGENT: False, OTHER: False})
    grpc_addr, http, listen = door_addresses()
    env = base_env(nats_url, database_url, kb_index, GENERATOR_BACKEND="extractive",
                   AVAP_PARSER_TIMEOUT="0", **listen)
    connections = Connections(nats_url, creds)
    db = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        async with running(env, WORKERS):
            yield Stack(await connections(AGENT), http, grpc_addr, creds[AGENT].token, db,
                        await connections(OTHER))
    finally:
        await connections.close()
        await db.close()


async def _logged(db: asyncpg.Connection, request_id: str) -> list[asyncpg.Record]:
    for _ in range(100):
        rows = await db.fetch("SELECT query_type, outcome, model_parts FROM request_log "
                              "WHERE agent_id = $1 AND request_id = $2", AGENT, request_id)
        if rows:
            return rows
        await asyncio.sleep(0.05)
    raise AssertionError(f"no request-log row for {request_id}")


@pytest.mark.parametrize(("query", "types"), [
    (TWO, ["RETRIEVAL", "RETRIEVAL"]), (THREE, ["RETRIEVAL", "CODE_GENERATION", "PLATFORM"])])
async def test_a_message_is_answered_part_by_part_on_nats(
    parts_stack: Stack, query: str, types: list[str]
) -> None:
    req = make_request(query, agent_id=AGENT, extra_context=INVOICE)
    chunks = await ask_all(parts_stack.nc, req)
    finals = [c for c in chunks if c.is_final]
    assert len(finals) == 1
    assert finals[0].error is None
    markers = [c for c in chunks if c.kind == ChunkKind.PART]
    # Two questions of one kind are answered as one part: nothing to split for them.
    if len(set(types)) == 1:
        assert markers == []
        assert finals[0].parts == []
        return
    assert [m.part.index for m in markers if m.part] == list(range(len(types)))
    assert [p.query_type for p in finals[0].parts] == types
    text = assemble(chunks)
    assert text.index("### 1.") < text.index("### 2.") < text.index("### 3.")
    assert "12.40" in text.split("### 3.")[1]  # the PLATFORM part's answer, in its place
    (row,) = await _logged(parts_stack.db, req.request_id)
    assert (row["query_type"], row["outcome"]) == ("RET+CODE+PLAT", "ok")
    history = await parts_stack.db.fetch(
        "SELECT type FROM classify_history WHERE agent_id = $1 AND request_id LIKE $2 "
        "ORDER BY request_id", AGENT, f"{req.request_id}#%")
    assert [h["type"] for h in history] == types


async def test_the_openai_door_returns_one_message_with_the_parts_in_order(
    parts_stack: Stack
) -> None:
    client = openai.AsyncOpenAI(base_url=f"{parts_stack.http}/v1", api_key=parts_stack.token,
                                max_retries=0, timeout=30)
    # The account data rides in a system message (the door's extra_context).
    messages: Any = [{"role": "system", "content": INVOICE}, {"role": "user", "content": THREE}]
    answer = await client.chat.completions.create(model="intentroute", messages=messages)
    content = answer.choices[0].message.content or ""
    assert content.index("### 1. explain addVar") < content.index("### 2.") < content.index(
        "### 3.")
    assert "12.40" in content
    streamed = await client.chat.completions.create(model="intentroute", messages=messages,
                                                    stream=True)
    pieces = [c.choices[0].delta.content or "" async for c in streamed if c.choices]
    joined = "".join(pieces)
    assert joined.index("### 1.") < joined.index("### 2.") < joined.index("### 3.")


async def test_grpc_answers_the_parts_in_order(parts_stack: Stack) -> None:
    async with grpc.aio.insecure_channel(parts_stack.grpc_addr) as channel:
        stub = agent_pb2_grpc.AssistanceEngineStub(channel)
        reply = await stub.AskAgent(
            agent_pb2.AgentRequest(query=THREE, session_id="g-parts",
                                   extra_context=INVOICE),
            metadata=(("authorization", f"Bearer {parts_stack.token}"),))
    assert reply.text.index("### 1.") < reply.text.index("### 2.") < reply.text.index(
        "### 3.")


async def _verdicts(db: asyncpg.Connection, agent: str, request_id: str) -> dict[str, str]:
    rows = await db.fetch("SELECT request_id, outcome FROM feedback WHERE agent_id = $1 "
                          "AND (request_id = $2 OR request_id LIKE $2 || '#%')",
                          agent, request_id)
    return {r["request_id"]: r["outcome"] for r in rows}


async def test_a_verdict_on_one_part_lands_on_that_part_alone_through_every_door(
    parts_stack: Stack
) -> None:
    """Part 1 judged over NATS, part 2 over gRPC and HTTP (a repeat): each verdict is
    stored on its part (its classify_history entry's id), the whole request keeps no
    verdict of its own until the agent gives one, and the request's outcome is its
    worst part's until then. A part the message lacks is INVALID_FIELD; another agent
    cannot judge any part of it."""
    req = make_request(THREE, agent_id=AGENT, extra_context=INVOICE)
    chunks = await ask_all(parts_stack.nc, req)
    final = chunks[-1]
    assert [p.index for p in final.parts] == [0, 1, 2]
    await _logged(parts_stack.db, req.request_id)
    rid = req.request_id

    nats_ack = await send_feedback(parts_stack.nc, AGENT, Feedback(
        request_id=rid, outcome=FeedbackOutcome.USER_REJECTED, part=1))
    assert (nats_ack.accepted, nats_ack.part) == (True, 1)
    async with grpc.aio.insecure_channel(parts_stack.grpc_addr) as channel:
        stub = agent_pb2_grpc.AssistanceEngineStub(channel)
        reply = await stub.Feedback(
            agent_pb2.FeedbackRequest(request_id=rid, outcome="success", part=2),
            metadata=(("authorization", f"Bearer {parts_stack.token}"),))
        assert reply.accepted
        with pytest.raises(grpc.aio.AioRpcError) as lacking:
            await stub.Feedback(
                agent_pb2.FeedbackRequest(request_id=rid, outcome="success", part=3),
                metadata=(("authorization", f"Bearer {parts_stack.token}"),))
    assert lacking.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "INVALID_FIELD" in (lacking.value.details() or "")
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{parts_stack.http}/agents/{AGENT}/feedback",
                               json={"request_id": rid, "outcome": "success", "part": 2},
                               headers={"Authorization": f"Bearer {parts_stack.token}"})
        assert (resp.status, await resp.json()) == (
            200, {"request_id": rid, "accepted": True, "repeat": True, "part": 2})

    assert await _verdicts(parts_stack.db, AGENT, rid) == {
        f"{rid}#2": "user_rejected", f"{rid}#3": "success"}
    assert await _outcome(parts_stack.db, rid) == "user_rejected"
    # Another agent: its own unknown request, whichever part; nothing stored anywhere.
    theirs = await send_feedback(parts_stack.other, OTHER, Feedback(
        request_id=rid, outcome=FeedbackOutcome.ERROR, part=0))
    assert (theirs.accepted, theirs.error_code) == (False, "UNKNOWN_REQUEST")
    assert await _verdicts(parts_stack.db, OTHER, rid) == {}
    # A verdict on the whole request works as before, and decides the request's outcome.
    whole = await send_feedback(parts_stack.nc, AGENT, Feedback(
        request_id=rid, outcome=FeedbackOutcome.SUCCESS))
    assert (whole.accepted, whole.part, whole.repeat) == (True, None, False)
    assert await _verdicts(parts_stack.db, AGENT, rid) == {
        rid: "success", f"{rid}#2": "user_rejected", f"{rid}#3": "success"}
    assert await _outcome(parts_stack.db, rid) == "success"


async def test_a_part_verdict_on_a_request_answered_whole_is_invalid_field(
    parts_stack: Stack
) -> None:
    req = make_request("what does addVar do?", agent_id=AGENT)
    chunks = await ask_all(parts_stack.nc, req)
    assert chunks[-1].parts == []
    await _logged(parts_stack.db, req.request_id)
    ack = await send_feedback(parts_stack.nc, AGENT, Feedback(
        request_id=req.request_id, outcome=FeedbackOutcome.SUCCESS, part=0))
    assert (ack.accepted, ack.error_code, ack.part) == (False, "INVALID_FIELD", 0)
    assert await _verdicts(parts_stack.db, AGENT, req.request_id) == {}


async def _outcome(db: asyncpg.Connection, request_id: str) -> str | None:
    """The outcome the agent's scores count for the request."""
    return await db.fetchval(f"SELECT {OUTCOME_SQL} FROM {VERDICTS_SQL} "
                             "WHERE r.agent_id = $1 AND r.request_id = $2", AGENT, request_id)
