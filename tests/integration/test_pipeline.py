"""End to end through the five workers on real NATS JetStream and PostgreSQL."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.retriever.embedded import EmbeddedRetrieval
from shared.client.caller import assemble, replay
from shared.contracts.response import ChunkKind, ValidationStatus
from shared.contracts.routing import Layer, ModelSlot, QueryType
from tests.helpers.pipeline import RecordingRetrieval, ask_all, base_env, make_request, running

pytestmark = pytest.mark.integration


def recording(kb_index: Path) -> RecordingRetrieval:
    return RecordingRetrieval(EmbeddedRetrieval(kb_index, method="bm25", encoder=None))


async def test_four_types_end_to_end_with_extractive_answerer(nc, nats_url, database_url,
                                                              kb_index) -> None:
    env = base_env(nats_url, database_url, kb_index)
    async with running(env):
        session = "four-types"
        retrieval = await ask_all(nc, make_request("What does addParam do?", session_id=session))
        code = await ask_all(nc, make_request("endpoint that returns the user id",
                                              session_id=session, query_type="CODE_GENERATION"))
        conv = await ask_all(nc, make_request("say it again", session_id=session,
                                              query_type="CONVERSATIONAL"))
        platform = await ask_all(nc, make_request(
            "You have a project usage percentage of 20%, provide a recommendation",
            session_id=session, extra_context="usage_percentage=20 plan=starter"))

    for chunks in (retrieval, code, conv, platform):
        assert sum(c.is_final for c in chunks) == 1
        assert chunks[-1].is_final
        assert [c.seq for c in chunks] == sorted(c.seq for c in chunks)
        assert chunks[-1].error is None
        assert chunks[-1].answered_by == "extractive"
        assert "extractive answer" in assemble(chunks)
    assert retrieval[-1].query_type == "RETRIEVAL"
    assert "addParam" in assemble(retrieval)
    assert code[-1].query_type == "CODE_GENERATION"
    assert code[0].kind == ChunkKind.STATUS  # progress while validating (RC-07)
    assert code[-1].validation_status == ValidationStatus.PARSER_UNAVAILABLE
    assert code[-1].avap_code.strip()
    assert conv[-1].query_type == "CONVERSATIONAL"
    # The conversational answer reuses the previous (code) answer of the session.
    reused = assemble(conv).split("]\n", 1)[1]
    assert reused[:40] in assemble(code)
    assert platform[-1].query_type == "PLATFORM"
    assert platform[-1].decision is not None
    assert platform[-1].decision.layer == Layer.RULES
    assert "usage_percentage=20" in assemble(platform)


async def test_platform_and_conversational_never_reach_the_retriever(
    nc, nats_url, database_url, kb_index
) -> None:
    rec = recording(kb_index)
    env = base_env(nats_url, database_url, kb_index)
    queries = {
        "PLATFORM": "cuántas llamadas llevo este mes? ref 7781",
        "CONVERSATIONAL": "hazlo más corto ref 7782",
        "RETRIEVAL": "how does startLoop count ref 7783",
    }
    async with running(env, retrievals=[rec]):
        finals = {}
        for declared, query in queries.items():
            qt = declared if declared == "CONVERSATIONAL" else None
            chunks = await ask_all(nc, make_request(query, query_type=qt))
            finals[declared] = chunks[-1]
    assert finals["PLATFORM"].query_type == "PLATFORM"
    assert finals["CONVERSATIONAL"].query_type == "CONVERSATIONAL"
    assert rec.queries == [queries["RETRIEVAL"]]


async def test_prd_scenario_1_platform_widget_served_by_conversational_model(
    nc, nats_url, database_url, kb_index, fake_ollama
) -> None:
    rec = recording(kb_index)
    env = base_env(nats_url, database_url, kb_index, OLLAMA_HOST=fake_ollama.url,
                   OLLAMA_MODEL_NAME="big:1.7b", OLLAMA_MODEL_NAME_CONVERSATIONAL="small:0.6b")
    async with running(env, retrievals=[rec]):
        chunks = await ask_all(nc, make_request(
            "You have a project usage percentage of 20%. Provide an insight. "
            "Rules: Exactly 3 sentences.", extra_context="usage_percentage=20"))
    final = chunks[-1]
    assert final.query_type == "PLATFORM"
    assert final.decision is not None
    assert final.decision.model_slot == ModelSlot.CONVERSATIONAL
    assert fake_ollama.models == ["small:0.6b"]
    assert final.answered_by == "ollama/small:0.6b"
    assert rec.queries == []
    system = fake_ollama.requests[0]["messages"][0]["content"]
    assert "usage_percentage=20" in system  # PLATFORM answers from extra_context


async def test_conversational_model_unset_main_model_serves_all_types(
    nc, nats_url, database_url, kb_index, fake_ollama
) -> None:
    env = base_env(nats_url, database_url, kb_index, OLLAMA_HOST=fake_ollama.url,
                   OLLAMA_MODEL_NAME="big:1.7b")
    async with running(env):
        session = "main-only"
        for query, qt in (("What is addVar?", None), ("en menos palabras", "CONVERSATIONAL"),
                          ("my invoice for October looks wrong", None)):
            chunks = await ask_all(nc, make_request(query, session_id=session, query_type=qt))
            assert chunks[-1].error is None
    assert fake_ollama.models == ["big:1.7b"] * 3


async def test_prd_scenario_4_conversational_follow_up_skips_retrieval(
    nc, nats_url, database_url, kb_index, fake_ollama
) -> None:
    rec = recording(kb_index)
    env = base_env(nats_url, database_url, kb_index, OLLAMA_HOST=fake_ollama.url,
                   OLLAMA_MODEL_NAME="big:1.7b", OLLAMA_MODEL_NAME_CONVERSATIONAL="small:0.6b")
    async with running(env, retrievals=[rec]):
        session = "scenario-4"
        first = await ask_all(nc, make_request("What does startLoop do in AVAP?",
                                               session_id=session))
        second = await ask_all(nc, make_request("en menos palabras", session_id=session))
    assert first[-1].query_type == "RETRIEVAL"
    assert second[-1].query_type == "CONVERSATIONAL"
    assert rec.queries == ["What does startLoop do in AVAP?"]
    assert fake_ollama.models == ["big:1.7b", "small:0.6b"]
    # The conversational prompt carries the previous answer, not retrieved documents.
    assert assemble(first) in fake_ollama.requests[1]["messages"][0]["content"]


async def test_two_replicas_of_a_stage_share_the_work(nc, nats_url, database_url,
                                                     kb_index) -> None:
    a, b = recording(kb_index), recording(kb_index)
    env = base_env(nats_url, database_url, kb_index, RETRIEVER_BATCH="1")
    names = ("gateway", "classifier", "retriever", "retriever", "generator-main")
    async with running(env, names, retrievals=[a, b]):
        requests = [make_request(f"what does addVar do? ({i})") for i in range(24)]
        results = await asyncio.gather(*(ask_all(nc, r) for r in requests))
    assert all(chunks[-1].error is None for chunks in results)
    assert len(a.queries) + len(b.queries) == 24
    assert a.queries
    assert b.queries


async def test_late_subscriber_reads_the_whole_answer(nc, nats_url, database_url,
                                                     kb_index) -> None:
    env = base_env(nats_url, database_url, kb_index)
    async with running(env):
        req = make_request("How does try and exception work?")
        live = await ask_all(nc, req)
        # Served by the gateway from the stored chunks (the agent creates no consumer).
        late = [c async for c in replay(nc, req.agent_id, req.request_id, timeout=5)]
    assert late == live
    assert late[-1].is_final
    assert assemble(late)


async def test_bad_input_gets_an_error_chunk(nc, nats_url, database_url, kb_index) -> None:
    import json

    from shared.client.caller import follow
    from shared.contracts.response import INVALID_REQUEST_ID, response_subject

    env = base_env(nats_url, database_url, kb_index)
    ok = {"request_id": "", "session_id": "s", "query": "hi"}
    cases = {
        "MALFORMED_JSON": (b'{"request_id": "bad-json-1", "query": ', "bad-json-1"),
        "MISSING_FIELD": (json.dumps({**ok, "request_id": "missing-1", "query": ""}).encode(),
                          "missing-1"),
        "OVERSIZED_FIELD": (json.dumps({**ok, "request_id": "big-1", "query": "x" * 9000})
                            .encode(), "big-1"),
        "UNKNOWN_QUERY_TYPE": (json.dumps({**ok, "request_id": "qt-1", "query_type": "SQL"})
                               .encode(), "qt-1"),
        "INVALID_FIELD": (json.dumps({**ok, "request_id": "wrongtype-1", "query": 42}).encode(),
                          "wrongtype-1"),
    }
    js = nc.jetstream()
    async with running(env, ("gateway",)):
        for code, (payload, rid) in cases.items():
            sub = await nc.subscribe(response_subject("tests", rid))
            await js.publish("agent.request.tests", payload)
            chunks = [c async for c in follow(sub, timeout=10)]
            await sub.unsubscribe()
            assert len(chunks) == 1, code
            assert chunks[0].is_final, code
            assert chunks[0].error is not None, chunks
            assert chunks[0].error.code == code, chunks
            assert chunks[0].error.message
        # No request id at all: answered on the agent's invalid subject, not dropped.
        sub = await nc.subscribe(response_subject("tests", INVALID_REQUEST_ID))
        await js.publish("agent.request.tests", b"not json at all")
        chunks = [c async for c in follow(sub, timeout=10)]
        assert chunks[0].error is not None
        assert chunks[0].error.code == "MALFORMED_JSON"
        assert "not json at all" in chunks[0].text


async def test_classify_history_keeps_session_order_and_readers_get_six(
    connect_as, nats_url, database_url, kb_index, store
) -> None:
    env = base_env(nats_url, database_url, kb_index)
    a, b = await connect_as("agent-a"), await connect_as("agent-b")
    async with running(env):
        for i in range(8):
            # an unambiguous docs question: the types below must not hinge on a borderline call
            await ask_all(a, make_request(f"what does addVar return in example {i}?",
                                          session_id="hist", agent_id="agent-a"))
        await ask_all(b, make_request("other agent same session id",
                                      session_id="hist", agent_id="agent-b"))
    history = await store.last_history("agent-a", "hist")
    assert [h.topic for h in history] == [
        f"what does addVar return in example {i}?" for i in range(2, 8)]
    assert all(h.type == QueryType.RETRIEVAL for h in history)
    other = await store.last_history("agent-b", "hist")
    assert [h.topic for h in other] == ["other agent same session id"]


async def test_relevance_retry_happens_at_most_once_and_is_recorded(
    nc, nats_url, database_url, kb_index, store
) -> None:
    rec = recording(kb_index)
    env = base_env(nats_url, database_url, kb_index, RELEVANCE_SIGNAL="top1_bm25",
                   RELEVANCE_THRESHOLD="2.5")
    async with running(env, retrievals=[rec]):
        off_topic = make_request("What is the boiling point of tungsten?",
                                 query_type="RETRIEVAL")
        miss = await ask_all(nc, off_topic)
        first = len(rec.queries)
        hit = await ask_all(nc, make_request("How does startLoop count?",
                                             query_type="RETRIEVAL"))
    assert miss[-1].retried is True
    assert first == 2
    assert hit[-1].retried is False
    assert len(rec.queries) == 3
    row = await store.pool.fetchrow("SELECT retried FROM request_log WHERE agent_id = $1 "
                                    "AND request_id = $2", "tests", off_topic.request_id)
    assert row["retried"] is True
