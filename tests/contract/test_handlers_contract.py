"""Contract tier: stage handlers fed JetStream deliveries, publishing on a recording bus.

Each test delivers wire bytes to a stage as its consumer would and checks what the
stage publishes, on which subject and stream, in which contract."""

from __future__ import annotations

import json

from services.classifier.cascade import Cascade
from services.classifier.handlers import ClassifierDeps
from services.classifier.handlers import build_stage as classifier_stage
from services.classifier.settings import ClassifierSettings
from services.gateway.handlers import GatewayDeps
from services.gateway.handlers import build_stage as gateway_stage
from services.gateway.settings import GatewaySettings
from shared.codec import decode_chunk, decode_envelope, encode
from shared.contracts.pipeline import Envelope
from shared.contracts.request import AgentRequest
from shared.contracts.routing import HistoryEntry, QueryType
from shared.settings import CommonSettings
from shared.stage import history_row
from shared.store.stores import HistoryRow


class FakeStore:
    def __init__(self) -> None:
        self.rows: list[object] = []
        self.history_reads = 0

    async def last_history(self, agent_id: str, session_id: str, n: int = 6
                           ) -> list[HistoryEntry]:
        self.history_reads += 1
        return [HistoryEntry(QueryType.RETRIEVAL, "what is addVar")] * 5

    async def write(self, *rows: object) -> None:
        self.rows.extend(rows)

    async def close(self) -> None:
        pass


class RecordingBus:
    """What a stage published: (subject, stream or "" for core, payload)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, bytes]] = []

    async def publish(self, subject: str, payload: bytes) -> None:
        self.sent.append((subject, "", payload))

    async def publish_durable(self, subject: str, payload: bytes, *, stream: str,
                              msg_id: str) -> None:
        self.sent.append((subject, stream, payload))

    def on(self, subject: str) -> list[bytes]:
        return [payload for subj, _, payload in self.sent if subj == subject]


class FakeDelivery:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.deliveries = 1
        self.settled = False

    async def nack(self, delay: float | None = None) -> None:
        self.settled = True

    async def in_progress(self) -> None:
        pass


COMMON = CommonSettings(nats_url="nats://unused:4222")


async def test_gateway_forwards_valid_and_answers_invalid() -> None:
    stage = gateway_stage(GatewaySettings(common=COMMON))
    assert (stage.spec.stream, stage.spec.subject) == ("AGENT_REQUESTS", "agent.request")
    bus, store = RecordingBus(), FakeStore()
    deps = GatewayDeps(bus, store)  # type: ignore[arg-type]
    ok = AgentRequest(request_id="ok-1", session_id="s", agent_id="a", query="hi")
    await stage.handle(FakeDelivery(encode(ok)), deps)  # type: ignore[arg-type]
    bad = {"request_id": "bad-1", "session_id": "s", "agent_id": "a", "query": "q",
           "query_type": "NOPE"}
    await stage.handle(FakeDelivery(json.dumps(bad).encode()), deps)  # type: ignore[arg-type]

    forwarded = [(subj, stream) for subj, stream, _ in bus.sent if subj.startswith("intentroute")]
    assert forwarded == [("intentroute.stage.classify", "INTENTROUTE_PIPELINE")]
    assert decode_envelope(bus.on("intentroute.stage.classify")[0]).request == ok
    (error,) = bus.on("agent.response.bad-1")
    chunk = decode_chunk(error)
    assert chunk.is_final and chunk.error is not None
    assert chunk.error.code == "UNKNOWN_QUERY_TYPE"
    assert len(store.rows) == 1


async def test_classifier_routes_platform_past_the_retriever_despite_history() -> None:
    stage = classifier_stage(ClassifierSettings(common=COMMON, heads_dir=""))
    bus, store = RecordingBus(), FakeStore()
    deps = ClassifierDeps(bus, store, Cascade())  # type: ignore[arg-type]
    env = Envelope(
        request=AgentRequest(request_id="p-1", session_id="s", agent_id="a",
                             query="cuántas llamadas llevo este mes?"),
        accepted_at=0.0,
    )
    await stage.handle(FakeDelivery(encode(env)), deps)  # type: ignore[arg-type]

    assert [(subj, stream) for subj, stream, _ in bus.sent] == [
        ("intentroute.stage.generate.conversational", "INTENTROUTE_PIPELINE")]
    out = decode_envelope(bus.on("intentroute.stage.generate.conversational")[0])
    assert out.decision is not None and out.decision.type == QueryType.PLATFORM
    # RC-02 decides from the message alone: the (RETRIEVAL-laden) history is not even read.
    assert store.history_reads == 0
    # The turn's classify_history row is written by the stage that ends the turn.
    assert history_row(out) == HistoryRow("a", "s", "p-1", "PLATFORM",
                                          "cuántas llamadas llevo este mes?", "rules", 1.0)


class UnsureLayer2:
    async def predict(self, text: str) -> object:
        from dataclasses import dataclass

        @dataclass(frozen=True)
        class P:
            label: str = "RETRIEVAL"
            confidence: float = 0.5
            alternatives: tuple = (("CODE_GENERATION", 0.3), ("PLATFORM", 0.2))

        return P()


async def _route_unsure(policy_by_agent: dict[str, str]) -> tuple[dict[str, bytes], FakeStore]:
    settings = ClassifierSettings(common=COMMON, heads_dir="",
                                  clarity_policy_by_agent=policy_by_agent)
    bus, store = RecordingBus(), FakeStore()
    deps = ClassifierDeps(bus, store, Cascade(layer2=UnsureLayer2()))  # type: ignore[arg-type]
    env = Envelope(request=AgentRequest(request_id="u-1", session_id="s", agent_id="widget",
                                        query="tell me about the thing"), accepted_at=0.0)
    await classifier_stage(settings).handle(FakeDelivery(encode(env)), deps)  # type: ignore[arg-type]
    seen = {"retrieve" if subj == "intentroute.stage.retrieve" else
            "answer" if subj == "agent.response.u-1" else subj: payload
            for subj, _, payload in bus.sent}
    return seen, store


async def test_clarity_policy_ask_answers_with_options_and_generates_nothing() -> None:
    seen, store = await _route_unsure({"widget": "ask"})
    assert set(seen) == {"answer"}
    chunk = decode_chunk(seen["answer"])
    assert chunk.is_final and chunk.kind == "clarification"
    assert chunk.decision is not None and chunk.decision.clarity == "needs_clarification"
    assert "RETRIEVAL" in chunk.text and "CODE_GENERATION" in chunk.text
    assert [type(r).__name__ for r in store.rows] == ["HistoryRow", "RequestLogRow"]


async def test_clarity_policy_proceed_routes_the_best_guess() -> None:
    seen, _ = await _route_unsure({})
    assert set(seen) == {"retrieve"}
    decision = decode_envelope(seen["retrieve"]).decision
    assert decision is not None and decision.layer == "fallback"
