"""A worker killed mid-answer, one trace across the five workers, the gRPC face."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from intentroute.supervisor import Supervisor
from shared.client.caller import ask, assemble
from shared.contracts.response import ChunkKind
from shared.grpc import agent_pb2, agent_pb2_grpc
from tests.helpers.pipeline import ask_all, base_env, make_request, running

pytestmark = pytest.mark.integration


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
    supervisor = Supervisor()
    slot = supervisor.add("generator-main",
                          [sys.executable, "-m", "intentroute.cli", "worker", "generator-main"],
                          {**os.environ, **env})
    watching = True

    async def supervise() -> None:
        while watching:
            supervisor.poll()
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(supervise())
    try:
        async with running(env, ("gateway", "classifier", "retriever")):
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
    finally:
        watching = False
        await watcher
        supervisor.stop(timeout=10)
    assert slot.restarts == 1
    assert chunks[-1].is_final
    assert chunks[-1].error is None
    assert sum(c.is_final for c in chunks) == 1
    assert any(c.kind == ChunkKind.RESET for c in chunks)
    assert assemble(chunks) == "".join(f"tok{i} " for i in range(8))
    assert len(fake_ollama.requests) == 2
    assert recovered < 5.0, f"answered {recovered:.1f}s after the kill"


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
