"""Contract tier: handlers against FastStream's in-memory TestNatsBroker and fakes."""

from __future__ import annotations

import json

from faststream.nats import JStream, NatsBroker, NatsMessage, TestNatsBroker

from services.classifier.cascade import Cascade
from services.classifier.handlers import ClassifierDeps
from services.classifier.handlers import build_router as classifier_router
from services.classifier.settings import ClassifierSettings
from services.gateway.handlers import GatewayDeps
from services.gateway.handlers import build_router as gateway_router
from services.gateway.settings import GatewaySettings
from shared.codec import decode_chunk, decode_envelope, encode
from shared.contracts.pipeline import Envelope
from shared.contracts.request import AgentRequest
from shared.contracts.routing import HistoryEntry, QueryType
from shared.settings import CommonSettings


class FakeStore:
    def __init__(self) -> None:
        self.rows: list[object] = []

    async def last_history(self, agent_id: str, session_id: str, n: int = 6
                           ) -> list[HistoryEntry]:
        return [HistoryEntry(QueryType.RETRIEVAL, "what is addVar")] * 5

    async def write(self, *rows: object) -> None:
        self.rows.extend(rows)

    async def close(self) -> None:
        pass


COMMON = CommonSettings(nats_url="nats://unused:4222")
# Hand-offs are JetStream publishes; the in-memory broker routes them by stream name.
PIPELINE = JStream("INTENTROUTE_PIPELINE", declare=False)
RESPONSES = JStream("AGENT_RESPONSES", declare=False)


async def test_gateway_forwards_valid_and_answers_invalid() -> None:
    broker = NatsBroker()
    broker.include_router(gateway_router(GatewaySettings(common=COMMON)))
    store = FakeStore()
    broker.context.set_global("deps", GatewayDeps(store))  # type: ignore[arg-type]
    forwarded: list[bytes] = []
    errors: list[bytes] = []

    @broker.subscriber("intentroute.stage.classify", stream=PIPELINE)
    async def classify(msg: NatsMessage) -> None:
        body = msg.body
        forwarded.append(body)

    @broker.subscriber("agent.response.bad-1", stream=RESPONSES)
    async def answer(msg: NatsMessage) -> None:
        body = msg.body
        errors.append(body)

    async with TestNatsBroker(broker) as br:
        ok = AgentRequest(request_id="ok-1", session_id="s", agent_id="a", query="hi")
        await br.publish(encode(ok), "agent.request", stream="AGENT_REQUESTS")
        bad = {"request_id": "bad-1", "session_id": "s", "agent_id": "a", "query": "q",
               "query_type": "NOPE"}
        await br.publish(json.dumps(bad).encode(), "agent.request", stream="AGENT_REQUESTS")

    assert decode_envelope(forwarded[0]).request == ok
    chunk = decode_chunk(errors[0])
    assert chunk.is_final and chunk.error is not None
    assert chunk.error.code == "UNKNOWN_QUERY_TYPE"
    assert len(store.rows) == 1


async def test_classifier_routes_platform_past_the_retriever_despite_history() -> None:
    broker = NatsBroker()
    broker.include_router(classifier_router(ClassifierSettings(common=COMMON, heads_dir="")))
    store = FakeStore()
    broker.context.set_global("deps", ClassifierDeps(store, Cascade()))  # type: ignore[arg-type]
    seen: dict[str, bytes] = {}

    @broker.subscriber("intentroute.stage.generate.conversational", stream=PIPELINE)
    async def conversational(msg: NatsMessage) -> None:
        body = msg.body
        seen["conversational"] = body

    @broker.subscriber("intentroute.stage.retrieve", stream=PIPELINE)
    async def retrieve(msg: NatsMessage) -> None:
        body = msg.body
        seen["retrieve"] = body

    env = Envelope(
        request=AgentRequest(request_id="p-1", session_id="s", agent_id="a",
                             query="cuántas llamadas llevo este mes?"),
        accepted_at=0.0,
    )
    async with TestNatsBroker(broker) as br:
        await br.publish(encode(env), "intentroute.stage.classify", stream="INTENTROUTE_PIPELINE")

    assert set(seen) == {"conversational"}
    out = decode_envelope(seen["conversational"])
    assert out.decision is not None and out.decision.type == QueryType.PLATFORM
    assert len(out.history) == 5
    assert store.rows and store.rows[0].type == "PLATFORM"  # type: ignore[attr-defined]


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
    broker = NatsBroker()
    settings = ClassifierSettings(common=COMMON, heads_dir="",
                                  clarity_policy_by_agent=policy_by_agent)
    broker.include_router(classifier_router(settings))
    store = FakeStore()
    deps = ClassifierDeps(store, Cascade(layer2=UnsureLayer2()))  # type: ignore[arg-type]
    broker.context.set_global("deps", deps)
    seen: dict[str, bytes] = {}

    @broker.subscriber("intentroute.stage.retrieve", stream=PIPELINE)
    async def retrieve(msg: NatsMessage) -> None:
        seen["retrieve"] = msg.body

    @broker.subscriber("agent.response.u-1", stream=RESPONSES)
    async def answer(msg: NatsMessage) -> None:
        seen["answer"] = msg.body

    env = Envelope(request=AgentRequest(request_id="u-1", session_id="s", agent_id="widget",
                                        query="tell me about the thing"), accepted_at=0.0)
    async with TestNatsBroker(broker) as br:
        await br.publish(encode(env), "intentroute.stage.classify", stream="INTENTROUTE_PIPELINE")
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
