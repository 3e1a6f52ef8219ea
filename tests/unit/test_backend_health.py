"""The generator's model backend state as `intentroute status` shows it: the outcome of
the last calls (the fallback chain records them), the start-up probe's finding until a
call says more, and the worst replica's line per stage."""

from __future__ import annotations

from collections.abc import AsyncIterator

from opentelemetry.trace import NoOpTracer

from intentroute.cli.status_cmd import state_lines
from services.generator.fallback import produce
from services.generator.health import BackendHealth
from services.generator.ports import BackendUnavailableError, ChatBackend
from services.generator.prompts import ChatMessage
from shared.contracts.pipeline import Routed
from shared.contracts.request import AgentRequest
from shared.contracts.routing import Layer, ModelSlot, QueryType, RoutingDecision
from shared.runtime.stage_status import Sample, parse_stats, stage_rows, worst_state


class _Refusing:
    name = "openai"

    async def stream(self, model: str, messages: list[ChatMessage]) -> AsyncIterator[str]:
        raise BackendUnavailableError("openai: HTTP 404: model_not_found")
        yield ""  # an async generator, as the real backends are


class _Answering:
    name = "openai"

    async def stream(self, model: str, messages: list[ChatMessage]) -> AsyncIterator[str]:
        yield "hi"


def _routed() -> Routed:
    return Routed(request=AgentRequest(query="say it again", agent_id="a", session_id="s",
                                       request_id="r"), accepted_at=0.0,
                  decision=RoutingDecision(QueryType.CONVERSATIONAL, Layer.DECLARED, 1.0,
                                           ModelSlot.CONVERSATIONAL))


async def _ask(backend: ChatBackend, health: BackendHealth) -> str:
    parts: list[str] = []

    async def sink(text: str) -> None:
        parts.append(text)

    async def restart() -> None:
        parts.clear()

    answered = await produce(backend, NoOpTracer(), ["gpt-x", "extractive"], _routed(),
                             previous_answer="", sink=sink, on_restart=restart, timeout=5.0,
                             health=health)
    return answered.answered_by


async def test_a_backend_failing_every_call_reads_failing_with_the_status() -> None:
    health = BackendHealth("openai", "gpt-x")
    assert health.state() == "unchecked: openai gpt-x not called yet"
    health.probe(None)  # the probe of /models passes: the model name is not checked there
    assert health.state().startswith("ok: openai gpt-x answered the start-up probe")
    for _ in range(3):
        assert await _ask(_Refusing(), health) == "extractive"
    state = health.state()
    assert state.startswith("failing: openai gpt-x failed the last 3 calls: openai: HTTP 404")
    assert "extractive answerer" in state
    health.probe("GET /models -> HTTP 500")  # a late probe does not hide what calls said
    assert health.state() == state
    assert await _ask(_Answering(), health) == "openai:gpt-x"
    assert health.state() == "ok: openai gpt-x answered the last call"


def test_a_failed_probe_reads_failing_at_start_and_lines_stay_short() -> None:
    health = BackendHealth("openai", "gpt-x")
    health.probe("GET http://h/v1/models -> HTTP 401: " + "x" * 500)
    state = health.state()
    assert state.startswith("failing: openai gpt-x at start: GET http://h/v1/models -> HTTP 401")
    assert len(state) < 300
    assert "\n" not in state
    assert BackendHealth("", "").state().startswith("extractive: no model server configured")


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
