"""Contract tier, gateway: `agent.request` wire bytes in, a hand-off or an error answer out."""

from __future__ import annotations

import json

from opentelemetry.trace import NoOpTracer

from services.gateway.handlers import build_stage
from services.gateway.settings import GatewaySettings
from shared.codec import decode_admitted, decode_chunk, encode
from shared.contracts.request import AgentRequest
from shared.stage import StageDeps
from tests.contract.fakes import COMMON, FakeDelivery, FakeStore, RecordingBus


async def test_gateway_forwards_valid_and_answers_invalid() -> None:
    stage = build_stage(GatewaySettings(common=COMMON))
    assert (stage.spec.stream, stage.spec.subject) == ("AGENT_REQUESTS", "agent.request")
    bus, store = RecordingBus(), FakeStore()
    deps = StageDeps(bus=bus, store=store, tracer=NoOpTracer())
    ok = AgentRequest(request_id="ok-1", session_id="s", agent_id="a", query="hi")
    await stage.handle(FakeDelivery(encode(ok)), deps)
    bad = {"request_id": "bad-1", "session_id": "s", "agent_id": "a", "query": "q",
           "query_type": "NOPE"}
    await stage.handle(FakeDelivery(json.dumps(bad).encode()), deps)

    forwarded = [(subj, stream) for subj, stream in bus.subjects()
                 if subj.startswith("intentroute")]
    assert forwarded == [("intentroute.stage.classify", "INTENTROUTE_PIPELINE")]
    (_, _, msg_id, payload), = [s for s in bus.sent if s[0] == "intentroute.stage.classify"]
    assert msg_id == "ok-1:accepted"
    assert decode_admitted(payload).request == ok
    (error,) = bus.on("agent.response.bad-1")
    chunk = decode_chunk(error)
    assert chunk.is_final
    assert chunk.error is not None
    assert chunk.error.code == "UNKNOWN_QUERY_TYPE"
    assert len(store.rows) == 1


async def test_gateway_answers_unreadable_input_on_the_invalid_subject() -> None:
    bus, store = RecordingBus(), FakeStore()
    deps = StageDeps(bus=bus, store=store, tracer=NoOpTracer())
    await build_stage(GatewaySettings(common=COMMON)).handle(FakeDelivery(b"{not json"), deps)
    (payload,) = bus.on("agent.response._invalid")
    chunk = decode_chunk(payload)
    assert chunk.is_final
    assert chunk.error is not None
    assert chunk.error.code == "MALFORMED_JSON"
    assert store.rows == []
