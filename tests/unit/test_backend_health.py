"""The fleet's model state as `intentroute status` shows it: the outcome of the last
calls (the chain's walks record them), the start-up probe's finding until a call says
more, an open circuit with since when and its last error, and the worst replica's line
per stage."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from opentelemetry.trace import NoOpTracer

from intentroute.cli.status_cmd import state_lines
from services.generator.fallback import produce
from services.generator.health import FleetHealth
from services.generator.prompts import ChatMessage
from shared.contracts.pipeline import Routed
from shared.contracts.request import AgentRequest
from shared.contracts.routing import Layer, ModelSlot, QueryType, RoutingDecision
from shared.llm.circuit import Circuit, State
from shared.llm.faults import classify_status
from shared.llm.fleet import BackendKind, BackendSpec, Fleet, ModelSpec
from shared.llm.ports import ChatBackend, Ended, Started, StreamEvent
from shared.llm.walk import Timing, Walker
from shared.policy.chain import build_chain
from shared.runtime.stage_status import Sample, parse_stats, stage_rows, worst_state

MODEL = "openai/gpt-x"
NOT_FOUND = '{"error": {"message": "The model `gpt-x` does not exist", "code": "model_not_found"}}'


class _Refusing:
    name = "openai"

    async def stream(self, model: str, messages: list[ChatMessage], *,
                     prefill: str = "") -> AsyncIterator[StreamEvent]:
        raise classify_status(404, NOT_FOUND)
        yield ""  # an async generator, as the real backends are


class _Answering:
    name = "openai"

    async def stream(self, model: str, messages: list[ChatMessage], *,
                     prefill: str = "") -> AsyncIterator[StreamEvent]:
        yield Started()
        yield "hi"
        yield Ended(marked=True, finish_reason="stop")


def _routed() -> Routed:
    return Routed(request=AgentRequest(query="say it again", agent_id="a", session_id="s",
                                       request_id="r"), accepted_at=time.time(),
                  decision=RoutingDecision(QueryType.CONVERSATIONAL, Layer.DECLARED, 1.0,
                                           ModelSlot.CONVERSATIONAL))


async def _ask(backend: ChatBackend, health: FleetHealth) -> str:
    parts: list[str] = []

    async def sink(text: str) -> None:
        parts.append(text)

    async def restart() -> None:
        parts.clear()

    fleet = Fleet(backends={"openai": BackendSpec(kind=BackendKind.OPENAI, url="http://h/v1",
                                                  models={"gpt-x": ModelSpec()})})
    walker = Walker(fleet, {"openai": backend})
    answered = await produce(walker, NoOpTracer(), build_chain(MODEL, ["extractive"]),
                             _routed(), previous_answer="", sink=sink, on_restart=restart,
                             timing=Timing(), health=health)
    return answered.answered_by


async def test_a_model_failing_every_call_reads_failing_with_the_status() -> None:
    health = FleetHealth([MODEL])
    assert health.state() == f"unchecked: {MODEL} not called yet"
    health.probe(MODEL, None)  # the probe of /models passes: the model name is not checked
    assert health.state().startswith(f"ok: {MODEL} answered the start-up probe")
    for _ in range(3):
        assert await _ask(_Refusing(), health) == "extractive"
    state = health.state()
    assert state.startswith(f"failing: {MODEL} failed the last 3 calls (refused: HTTP 404")
    assert "model_not_found" in state
    assert "extractive answerer" in state
    health.probe(MODEL, "GET /models -> HTTP 500")  # a late probe hides nothing calls said
    assert health.state() == state
    assert await _ask(_Answering(), health) == MODEL
    assert health.state() == f"ok: {MODEL} answered the last call"


def test_a_failed_probe_reads_failing_at_start_and_lines_stay_short() -> None:
    health = FleetHealth([MODEL])
    health.probe(MODEL, "GET http://h/v1/models -> HTTP 401: " + "x" * 500)
    state = health.state()
    assert state.startswith(f"failing: {MODEL} at start (GET http://h/v1/models -> HTTP 401")
    assert len(state) < 300
    assert "\n" not in state
    assert FleetHealth([]).state().startswith("extractive: no model server configured")


def test_an_open_circuit_reads_failing_since_when_with_its_last_error() -> None:
    health = FleetHealth([MODEL, "local/small"])
    health.circuits = {"openai": Circuit(State.OPEN, since=time.time(), failures=3,
                                         error="server_error: HTTP 500: boom")}
    assert health.breaker("openai") == "OPEN"
    assert health.breaker("local") == "CLOSED"
    word, phrase = health.model_state(MODEL)
    assert word == "failing"
    assert phrase.startswith(f"{MODEL} circuit open since ")
    assert phrase.endswith("(server_error: HTTP 500: boom)")
    assert health.model_state("local/small")[0] == "unchecked"
    assert health.state().startswith(f"failing: {MODEL} circuit open since ")


def test_status_shows_the_worst_replica_and_each_replicas_own() -> None:
    assert worst_state(["ok: a", "failing: b", "unchecked: c"]) == "failing: b"
    assert worst_state(["ok: a", "unchecked: c"]) == "unchecked: c"

    def reply(rid: str, line: str) -> dict[str, object]:
        return {"name": "intentroute-generator-main", "id": rid, "endpoints": [
            {"name": "generator-main", "num_requests": 1, "data": {"states": {
                "backend": line}}}]}

    instances = [*parse_stats(reply("A", "ok: openai m answered the last call")),
                 *parse_stats(reply("B", "failing: openai m failed the last call: [x]"))]
    rows = {r.stage: r for r in stage_rows(Sample(at=1, instances=instances, lag={},
                                                  dead_letters={}))}
    row = rows["generator-main"]
    assert row.states == {"backend": "failing: openai m failed the last call: [x]"}
    assert [i["states"]["backend"][:2] for i in row.instances] == ["ok", "fa"]
    assert rows["classifier"].states == {}
    # In the table's caption, red, and the server's text is not read as markup.
    assert state_lines([row]) == [
        "\n[red]generator-main backend: failing: openai m failed the last call: \\[x][/red]"]
