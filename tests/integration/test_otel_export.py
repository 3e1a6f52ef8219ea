"""OpenTelemetry as its standard variables configure it, seen by an OTLP receiver: a gRPC
caller's `traceparent` is continued by the gateway's door, every stage, the store writes
and the parser call, one trace per request with the request's attributes, exported over
gRPC and over HTTP (protobuf); OTEL_SERVICE_NAME names the services, OTEL_SDK_DISABLED
exports nothing; the OpenAI-compatible door continues an HTTP caller's `traceparent`."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from intentroute.stack import free_port
from services.parser.server import serve
from shared.common.otel import AGENT_ID, LAYER, QUERY_TYPE, REQUEST_ID
from shared.grpc import agent_pb2, agent_pb2_grpc
from tests.helpers.agents import add_agents
from tests.helpers.pipeline import base_env, running

pytestmark = pytest.mark.integration

VALID = "Here it is:\n```avap\naddParam(password, pwd)\nencodeSHA256(pwd, hash)\n" \
        "addResult(hash)\n```\n"
SERVER = trace_pb2.Span.SpanKind.SPAN_KIND_SERVER
CONSUMER = trace_pb2.Span.SpanKind.SPAN_KIND_CONSUMER
STAGES = ("agent.request", "intentroute.stage.classify", "intentroute.stage.retrieve",
          "intentroute.stage.generate.main", "intentroute.stage.validate")
WORKERS = {"intentroute-doors", "intentroute-gateway", "intentroute-classifier",
           "intentroute-retriever", "intentroute-generator-main", "intentroute-validator"}


@dataclass
class Received:
    """What the receiver was sent: each export's spans with their service's name, and
    the headers / metadata each export came with."""

    spans: list[tuple[str, trace_pb2.Span]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    def add(self, request: trace_service_pb2.ExportTraceServiceRequest,
            headers: dict[str, str]) -> None:
        self.headers.append(headers)
        for resource_spans in request.resource_spans:
            service = attributes(resource_spans.resource.attributes).get("service.name", "")
            for scope in resource_spans.scope_spans:
                self.spans.extend((service, span) for span in scope.spans)


def attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value") or "string_value")
            for kv in pairs}


class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    async def Export(self, request: Any, context: Any) -> Any:
        self.received.add(request, dict(context.invocation_metadata() or ()))
        return trace_service_pb2.ExportTraceServiceResponse()


@asynccontextmanager
async def otlp_receiver(protocol: str) -> AsyncIterator[tuple[str, Received]]:
    """An OTLP trace receiver: (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, what it received)."""
    received = Received()
    port = free_port()
    if protocol == "grpc":
        server = grpc.aio.server()
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
            TraceService(received), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        try:
            yield f"http://127.0.0.1:{port}", received
        finally:
            await server.stop(0)
        return

    async def export(request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        received.add(trace_service_pb2.ExportTraceServiceRequest.FromString(
            await request.read()), {k.lower(): v for k, v in request.headers.items()})
        return web.Response(body=trace_service_pb2.ExportTraceServiceResponse()
                            .SerializeToString(), content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", export)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/v1/traces", received
    finally:
        await runner.cleanup()


@pytest.fixture
async def otel_agent(nats_url: str, database_url: str) -> str:
    """A trusted agent of these tests only (it declares CODE_GENERATION): its token."""
    creds = await add_agents(nats_url, database_url, {"otel": True})
    return creds["otel"].token


@pytest.fixture
async def parser_url() -> AsyncIterator[str]:
    port = free_port()
    server = await serve("127.0.0.1", port)
    yield f"127.0.0.1:{port}"
    await server.stop(0)


def set_otel(monkeypatch: pytest.MonkeyPatch, **variables: str) -> dict[str, str]:
    """OTEL_* for the workers' settings (the returned mapping) and for the SDK's
    exporters, which read the process environment (restored after the test)."""
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    return variables


async def ask_over_grpc(address: str, token: str, traceparent: str, **fields: Any
                        ) -> list[Any]:
    metadata = (("authorization", f"Bearer {token}"), ("traceparent", traceparent))
    async with grpc.aio.insecure_channel(address) as channel:
        stub = agent_pb2_grpc.AssistanceEngineStub(channel)  # type: ignore[no-untyped-call]
        request = agent_pb2.AgentRequest(session_id=f"otel-{secrets.token_hex(4)}",
                                         agent_id="otel", **fields)
        return [r async for r in stub.AskAgentStream(request, metadata=metadata)]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
async def test_a_grpc_callers_traceparent_is_one_trace_through_every_worker(
    protocol: str, monkeypatch: pytest.MonkeyPatch, nats_url: str, database_url: str,
    kb_index: Any, fake_ollama: Any, parser_url: str, otel_agent: str,
) -> None:
    fake_ollama.responder = lambda body: [VALID[i:i + 16] for i in range(0, len(VALID), 16)]
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    grpc_address = f"127.0.0.1:{free_port()}"
    # Over HTTP the services are named by OTEL_SERVICE_NAME; over gRPC by their worker.
    named = {"OTEL_SERVICE_NAME": "assist-router"} if protocol != "grpc" else {}
    async with otlp_receiver(protocol) as (endpoint, received):
        otel = set_otel(monkeypatch, OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
                        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=endpoint,
                        OTEL_EXPORTER_OTLP_TRACES_HEADERS="x-tenant=intentroute-tests",
                        OTEL_BSP_SCHEDULE_DELAY="200", **named)
        env = base_env(nats_url, database_url, kb_index, OLLAMA_HOST=fake_ollama.url,
                       OLLAMA_MODEL_NAME="big:1.7b", AVAP_PARSER_URL=parser_url,
                       GATEWAY_GRPC_LISTEN=grpc_address, **otel)
        async with running(env):
            responses = await ask_over_grpc(
                grpc_address, otel_agent, f"00-{trace_id}-{parent_id}-01",
                query="write an endpoint that hashes the password param",
                query_type="CODE_GENERATION")
        # The workers have stopped: every span batched was exported.
    final = responses[-1]
    assert final.is_final
    assert not final.error_code, final
    assert final.avap_code  # validated: the parser's verdict is on its span below
    spans = received.spans
    assert spans, "the receiver got no span"
    assert all(h.get("x-tenant") == "intentroute-tests" for h in received.headers)
    # One trace: the caller's.
    assert {span.trace_id.hex() for _, span in spans} == {trace_id}
    services = {service for service, _ in spans}
    if named:
        assert services == {"assist-router"}
    else:
        assert services >= WORKERS, services

    def attrs(span: trace_pb2.Span) -> dict[str, Any]:
        return attributes(span.attributes)

    routed = {REQUEST_ID: final.request_id, AGENT_ID: "otel",
              QUERY_TYPE: "CODE_GENERATION", LAYER: final.decision.layer}
    door = [span for _, span in spans if span.kind == SERVER]
    assert [span.name for span in door] == [
        "intentroute.agent.v1.AssistanceEngine/AskAgentStream"]
    assert door[0].parent_span_id.hex() == parent_id
    assert attrs(door[0]).items() >= routed.items()
    assert attrs(door[0])["rpc.system"] == "grpc"
    consumers = {span.name: attrs(span) for _, span in spans if span.kind == CONSUMER}
    for stage in STAGES:
        name = next((n for n in consumers if n.startswith(f"{stage}")), None)
        assert name is not None, (stage, sorted(consumers))
        # Every stage names the request; from the classifier on, its route too.
        expected = routed if stage != "agent.request" else {
            REQUEST_ID: final.request_id, AGENT_ID: "otel"}
        assert consumers[name].items() >= expected.items(), (stage, consumers[name])
    writes = [attrs(span) for _, span in spans if span.name == "store.write"]
    assert any(w.items() >= routed.items() for w in writes), writes
    parser_calls = [attrs(span) for _, span in spans if span.name == "avap_parser.Validate"]
    assert len(parser_calls) == 1
    assert parser_calls[0].items() >= {**routed, "intentroute.parser.verdict": "VALID"}.items()


async def test_otel_sdk_disabled_exports_nothing(
    monkeypatch: pytest.MonkeyPatch, nats_url: str, database_url: str, kb_index: Any,
    otel_agent: str,
) -> None:
    """The same settings as above, but OTEL_SDK_DISABLED=true: the receiver hears
    nothing although the gateway handled the request (its door and its stage; no other
    worker runs here, so the door gives up after GATEWAY_ANSWER_TIMEOUT)."""
    grpc_address = f"127.0.0.1:{free_port()}"
    async with otlp_receiver("grpc") as (endpoint, received):
        otel = set_otel(monkeypatch, OTEL_SDK_DISABLED="true",
                        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=endpoint,
                        OTEL_BSP_SCHEDULE_DELAY="200")
        env = base_env(nats_url, database_url, kb_index, GATEWAY_GRPC_LISTEN=grpc_address,
                       GATEWAY_ANSWER_TIMEOUT="1.5", **otel)
        async with running(env, ("gateway", "doors")):
            with pytest.raises(grpc.aio.AioRpcError) as timed_out:
                await ask_over_grpc(grpc_address, otel_agent,
                                    f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01",
                                    query="what does addResult do?", timeout_ms=1000)
    assert timed_out.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert received.spans == []
    assert received.headers == []


async def test_the_openai_doors_span_continues_an_http_traceparent(
    nats_url: str, database_url: str, kb_index: Any, otel_agent: str,
) -> None:
    """POST /v1/chat/completions with a `traceparent` header: the door's SERVER span is
    its child, and the gateway's stage continues the door's span from the request's
    NATS headers. Only the gateway runs (the door gives up after its answer timeout;
    REQUEST_DEADLINE keeps the request from outliving the test)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    port = free_port()
    env = base_env(nats_url, database_url, kb_index, GATEWAY_HTTP_LISTEN=f"127.0.0.1:{port}",
                   GATEWAY_ANSWER_TIMEOUT="1.5", REQUEST_DEADLINE="2")
    body = {"model": "intentroute",
            "messages": [{"role": "user", "content": "what does addResult do?"}]}
    headers = {"Authorization": f"Bearer {otel_agent}",
               "traceparent": f"00-{trace_id}-{parent_id}-01"}
    async with running(env, ("gateway", "doors"), tracer_provider=provider), \
            aiohttp.ClientSession() as http, \
            http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body,
                      headers=headers) as resp:
        status, request_id = resp.status, resp.headers["x-request-id"]
        # The gateway's stage has handled it by the time the door gave up.
        spans = exporter.get_finished_spans()
    assert status == 504
    door = [s for s in spans if s.kind == SpanKind.SERVER]
    assert [s.name for s in door] == ["POST /v1/chat/completions"]
    assert door[0].parent is not None
    assert f"{door[0].parent.span_id:016x}" == parent_id
    assert f"{door[0].context.trace_id:032x}" == trace_id
    assert dict(door[0].attributes or {}).items() >= {
        REQUEST_ID: request_id, AGENT_ID: "otel", "http.route": "/v1/chat/completions"}.items()
    assert door[0].status.status_code == StatusCode.ERROR  # no answer in time
    stage = [s for s in spans if s.kind == SpanKind.CONSUMER]
    assert [s.name for s in stage] == ["agent.request.* process"]
    assert stage[0].parent is not None
    assert stage[0].parent.span_id == door[0].context.span_id
    assert dict(stage[0].attributes or {}).items() >= {
        REQUEST_ID: request_id, AGENT_ID: "otel"}.items()
