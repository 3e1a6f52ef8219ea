"""A worker killed mid-answer, one trace across the five workers, the gRPC face."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest
from nats.aio.msg import Msg
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from intentroute.supervisor import Supervised, Supervisor
from shared.client.caller import ask, assemble
from shared.contracts.codec import decode_chunk
from shared.contracts.response import ChunkKind, ResponseChunk, response_subject
from shared.grpc import agent_pb2, agent_pb2_grpc
from tests.helpers.pipeline import ask_all, base_env, make_request, running

pytestmark = pytest.mark.integration


@asynccontextmanager
async def supervised(name: str, env: dict[str, str]) -> AsyncIterator[Supervised]:
    """Worker `name` as a process under `up`'s supervisor, restarted when it dies."""
    supervisor = Supervisor()
    slot = supervisor.add(name, [sys.executable, "-m", "intentroute.cli", "worker", name],
                          {**os.environ, **env})
    watching = True

    async def supervise() -> None:
        while watching:
            supervisor.poll()
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(supervise())
    try:
        yield slot
    finally:
        watching = False
        await watcher
        supervisor.stop(timeout=10)


async def test_worker_killed_mid_answer_is_restarted_and_the_request_answered_within_5s(
    nc, nats_url, database_url, kb_index, fake_ollama
) -> None:
    """The generator, a process under `up`'s supervisor, is killed after streaming part
    of the answer: the supervisor restarts it, JetStream redelivers the message after
    the short ack_wait (the dead process no longer keeps it alive), and the new process
    restarts the answer (RESET) and finishes it, within 5 s of the kill."""
    fake_ollama.token_delay = 0.3
    fake_ollama.responder = lambda body: [f"tok{i} " for i in range(8)]
    env = base_env(nats_url, database_url, kb_index, OLLAMA_HOST=fake_ollama.url,
                   OLLAMA_MODEL_NAME="big:1.7b")
    async with supervised("generator-main", env) as slot, running(
            env, ("gateway", "classifier", "retriever")):
        req = make_request("what does addResult do?")
        first_text = asyncio.Event()
        chunks: list = []

        async def collect() -> None:
            async for chunk in ask(nc, req, timeout=60):
                chunks.append(chunk)
                if chunk.kind == ChunkKind.TEXT:
                    first_text.set()

        answer = asyncio.create_task(collect())
        # Kill only once part of the answer has reached the caller.
        await asyncio.wait_for(first_text.wait(), 60)
        assert slot.proc is not None
        slot.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        fake_ollama.token_delay = 0.0
        await asyncio.wait_for(answer, 30)
        recovered = time.monotonic() - killed
    assert slot.restarts == 1
    assert chunks[-1].is_final
    assert chunks[-1].error is None
    assert sum(c.is_final for c in chunks) == 1
    assert any(c.kind == ChunkKind.RESET for c in chunks)
    assert assemble(chunks) == "".join(f"tok{i} " for i in range(8))
    assert len(fake_ollama.requests) == 2
    assert recovered < 5.0, f"answered {recovered:.1f}s after the kill"


INVOICE_THEN_ADDVAR = "can you send me my last invoice? and then explain what addVar does"
ADDVAR_THEN_INVOICE = "explain what addVar does; also, can you send me my last invoice?"


@pytest.mark.parametrize(("query", "killed"), [
    # The RETRIEVAL part second: its retriever opened it, its generator dies.
    (INVOICE_THEN_ADDVAR, "generator-main"),
    # The PLATFORM part second: its generator opens it and dies answering it.
    (ADDVAR_THEN_INVOICE, "generator-conversational"),
])
async def test_a_message_answered_part_by_part_ends_once_when_its_generator_is_killed(
    connect_as, nats_url, database_url, kb_index, fake_ollama, store, query, killed
) -> None:
    """Issue 34: a two-part message whose second part's generator (a process under the
    supervisor) is killed while it streams that part: the restarted process answers the
    part again (a RESET inside it drops that part's text only), and the caller sees
    every part once, in order, and exactly one final chunk."""
    part = 1
    answers = {"big:1.7b": [f"ret{i} " for i in range(8)],
               "small:0.6b": [f"plat{i} " for i in range(8)]}
    types = (["PLATFORM", "RETRIEVAL"] if query == INVOICE_THEN_ADDVAR
             else ["RETRIEVAL", "PLATFORM"])
    texts = [answers["small:0.6b" if t == "PLATFORM" else "big:1.7b"] for t in types]
    fake_ollama.token_delay = 0.3
    fake_ollama.responder = lambda body: answers[body["model"]]
    env = base_env(nats_url, database_url, kb_index, OLLAMA_HOST=fake_ollama.url,
                   OLLAMA_MODEL_NAME="big:1.7b", OLLAMA_MODEL_NAME_CONVERSATIONAL="small:0.6b")
    req = make_request(query, agent_id="agent-a", extra_context="invoice 2026-10: 12.40 EUR")
    nc = await connect_as("agent-a")
    others = tuple(w for w in ("generator-main", "generator-conversational") if w != killed)
    # Every chunk published on the answer, as a subscriber that drops nothing reads it
    # (`ask` passes each seq on once).
    published: list[ResponseChunk] = []

    async def keep(msg: Msg) -> None:
        published.append(decode_chunk(msg.data))

    raw = await nc.subscribe(response_subject("agent-a", req.request_id), cb=keep)
    async with supervised(killed, env) as slot, running(
            env, ("gateway", "classifier", "retriever", *others)):
        killed_part_text = asyncio.Event()
        chunks: list = []

        async def collect() -> None:
            current = -1
            async for chunk in ask(nc, req, timeout=60):
                chunks.append(chunk)
                if chunk.kind == ChunkKind.PART and chunk.part is not None:
                    current = chunk.part.index
                elif chunk.kind == ChunkKind.TEXT and current == part:
                    killed_part_text.set()

        answer = asyncio.create_task(collect())
        await asyncio.wait_for(killed_part_text.wait(), 60)
        assert slot.proc is not None
        slot.proc.send_signal(signal.SIGKILL)
        fake_ollama.token_delay = 0.0
        await asyncio.wait_for(answer, 30)
    assert slot.restarts == 1
    finals = [c for c in chunks if c.is_final]
    assert len(finals) == 1
    assert chunks[-1] is finals[0]
    assert finals[0].error is None
    assert [p.query_type for p in finals[0].parts] == types
    await raw.unsubscribe()
    markers = [i for i, c in enumerate(chunks) if c.kind == ChunkKind.PART]
    assert [chunks[i].part.index for i in markers] == [0, 1]  # each part opened once
    assert [c.part.index for c in published if c.kind == ChunkKind.PART and c.part] == [0, 1]
    assert sum(c.is_final for c in published) == 1
    resets = [i for i, c in enumerate(chunks) if c.kind == ChunkKind.RESET]
    assert resets
    # Inside the killed part only.
    assert all(markers[part] < i < [*markers, len(chunks)][part + 1] for i in resets)
    text = assemble(chunks)
    assert text.count("### 1. ") == text.count("### 2. ") == 1
    first, second = text.split("### 2. ")
    assert first.endswith("".join(texts[0]) + "\n\n")
    assert first.count(texts[0][0]) == 1
    assert second.endswith("".join(texts[1]))
    assert second.count(texts[1][0]) == 1
    (row,) = await store.pool.fetch(
        "SELECT query_type, outcome FROM request_log WHERE agent_id = 'agent-a' "
        "AND request_id = $1", req.request_id)
    short = {"PLATFORM": "PLAT", "RETRIEVAL": "RET"}
    assert (row["query_type"], row["outcome"]) == ("+".join(short[t] for t in types), "ok")


async def test_one_request_one_trace_across_the_five_workers(
    nc, nats_url, database_url, kb_index
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    env = base_env(nats_url, database_url, kb_index)
    async with running(env, tracer_provider=provider):
        chunks = await ask_all(nc, make_request("write an endpoint returning a sha256 hash",
                                                query_type="CODE_GENERATION"))
    assert chunks[-1].is_final
    spans = exporter.get_finished_spans()
    consumers = {s.name for s in spans if s.kind.name == "CONSUMER"}
    for stage in ("agent.request", "intentroute.stage.classify", "intentroute.stage.retrieve",
                  "intentroute.stage.generate.main", "intentroute.stage.validate"):
        assert any(stage in name for name in consumers), (stage, consumers)
    traces = {s.context.trace_id for s in spans if s.kind.name == "CONSUMER"}
    assert len(traces) == 1
    assert any(s.name.startswith("store.") for s in spans)


async def test_grpc_ask_agent_stream_and_bad_input(nc, nats_url, database_url, kb_index,
                                                  agent_tokens) -> None:
    from intentroute.stack import free_port

    port = free_port()
    env = base_env(nats_url, database_url, kb_index, GATEWAY_GRPC_LISTEN=f"127.0.0.1:{port}")
    auth = (("authorization", f"Bearer {agent_tokens['grpc']}"),)
    async with running(env), grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = agent_pb2_grpc.AssistanceEngineStub(channel)
        req = agent_pb2.AgentRequest(query="How do I read a request parameter?",
                                     session_id="g1", agent_id="grpc")
        streamed = [r async for r in stub.AskAgentStream(req, metadata=auth)]
        unary = await stub.AskAgent(agent_pb2.AgentRequest(
            query="what is my quota usage? 80% of my plan", session_id="g1",
            extra_context="quota_used=80%"), metadata=auth)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.AskAgent(agent_pb2.AgentRequest(query="x", session_id="g1",
                                                       agent_id="grpc", query_type="SQL"),
                                metadata=auth)
    assert streamed[-1].is_final
    assert streamed[-1].query_type == "RETRIEVAL"
    # The answer's last piece rides on the final response.
    assert "".join(r.text for r in streamed)
    assert streamed[-1].text
    assert unary.is_final
    assert unary.query_type == "PLATFORM"
    assert "quota_used=80%" in unary.text
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "UNKNOWN_QUERY_TYPE" in (err.value.details() or "")


async def test_grpc_refuses_calls_without_the_agents_credential(
    nc, nats_url, database_url, kb_index, agent_tokens
) -> None:
    from intentroute.stack import free_port

    port = free_port()
    env = base_env(nats_url, database_url, kb_index, GATEWAY_GRPC_LISTEN=f"127.0.0.1:{port}")
    grpc_agent, _, secret = agent_tokens["grpc"].partition(".")
    attempts = {
        "none": ((), "grpc", grpc.StatusCode.UNAUTHENTICATED),
        "wrong secret": ((("authorization", f"Bearer grpc.{secret[::-1]}"),), "grpc",
                         grpc.StatusCode.UNAUTHENTICATED),
        "not bearer": ((("authorization", f"Basic {agent_tokens['grpc']}"),), "grpc",
                       grpc.StatusCode.UNAUTHENTICATED),
        "another agent's id": ((("authorization", f"Bearer {agent_tokens['grpc']}"),),
                               "agent-a", grpc.StatusCode.PERMISSION_DENIED),
    }
    async with running(env, ("gateway", "doors")), grpc.aio.insecure_channel(
            f"127.0.0.1:{port}") as channel:
        stub = agent_pb2_grpc.AssistanceEngineStub(channel)
        for name, (metadata, agent, code) in attempts.items():
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.AskAgent(agent_pb2.AgentRequest(
                    query="repeat your last answer", session_id="g1", agent_id=agent),
                    metadata=metadata)
            assert err.value.code() == code, name
    assert grpc_agent == "grpc"
