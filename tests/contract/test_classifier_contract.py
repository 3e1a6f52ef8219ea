"""Contract tier, classifier: an `Admitted` envelope in, a routed hand-off or a
clarification out."""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.trace import NoOpTracer

from services.classifier.cascade import Cascade
from services.classifier.handlers import ClassifierDeps, build_stage
from services.classifier.settings import ClassifierSettings
from shared.codec import decode_chunk, decode_routed
from shared.contracts.pipeline import Admitted
from shared.contracts.request import AgentRequest
from shared.contracts.routing import HistoryEntry, QueryType
from shared.stage import history_row
from shared.store.rows import HistoryRow
from tests.contract.fakes import ADMISSION, COMMON, FakeDelivery, FakeStore, RecordingBus, stamped


def deps_for(cascade: Cascade, store: FakeStore, bus: RecordingBus) -> ClassifierDeps:
    return ClassifierDeps(bus=bus, store=store, tracer=NoOpTracer(),
        admission=ADMISSION, cascade=cascade)


async def test_classifier_routes_platform_past_the_retriever_despite_history() -> None:
    stage = build_stage(ClassifierSettings(common=COMMON, heads_dir=""))
    bus = RecordingBus()
    store = FakeStore(history=[HistoryEntry(QueryType.RETRIEVAL, "what is addVar")] * 5)
    env = Admitted(
        request=AgentRequest(request_id="p-1", session_id="s", agent_id="a",
                             query="cuántas llamadas llevo este mes?"),
        accepted_at=0.0,
    )
    await stage.handle(FakeDelivery(stamped(env)), deps_for(Cascade(), store, bus))

    assert bus.subjects() == [
        ("intentroute.stage.generate.conversational", "INTENTROUTE_PIPELINE")]
    assert bus.sent[0][2] == "a:p-1:classified"
    out = decode_routed(bus.on("intentroute.stage.generate.conversational")[0])
    assert out.decision.type == QueryType.PLATFORM
    assert {"classify", "classify.at"} <= set(out.timings)
    # RC-02 decides from the message alone: the (RETRIEVAL-laden) history is not even read.
    assert store.history_reads == 0
    # The turn's classify_history row is written by the stage that ends the turn.
    assert history_row(out) == HistoryRow("a", "s", "p-1", "PLATFORM",
                                          "cuántas llamadas llevo este mes?", "rules", 1.0)


@dataclass(frozen=True)
class Unsure:
    label: str = "RETRIEVAL"
    confidence: float = 0.5
    alternatives: tuple[tuple[str, float], ...] = (("CODE_GENERATION", 0.3), ("PLATFORM", 0.2))


class UnsureLayer2:
    async def predict(self, text: str) -> Unsure:
        return Unsure()


async def _route_unsure(policy_by_agent: dict[str, str]) -> tuple[dict[str, bytes], FakeStore]:
    settings = ClassifierSettings(common=COMMON, heads_dir="",
                                  clarity_policy_by_agent=policy_by_agent)
    bus, store = RecordingBus(), FakeStore()
    env = Admitted(request=AgentRequest(request_id="u-1", session_id="s", agent_id="widget",
                                        query="tell me about the thing"), accepted_at=0.0)
    await build_stage(settings).handle(
        FakeDelivery(stamped(env)), deps_for(Cascade(layer2=UnsureLayer2()), store, bus))
    seen = {"retrieve" if subj == "intentroute.stage.retrieve" else
            "answer" if subj == "agent.response.widget.u-1" else subj: payload
            for subj, _, _, payload in bus.sent}
    return seen, store


async def test_clarity_policy_ask_answers_with_options_and_generates_nothing() -> None:
    seen, store = await _route_unsure({"widget": "ask"})
    assert set(seen) == {"answer"}
    chunk = decode_chunk(seen["answer"])
    assert chunk.is_final
    assert chunk.kind == "clarification"
    assert chunk.decision is not None
    assert chunk.decision.clarity == "needs_clarification"
    assert "RETRIEVAL" in chunk.text
    assert "CODE_GENERATION" in chunk.text
    assert store.kinds() == ["HistoryRow", "RequestLogRow"]


async def test_clarity_policy_proceed_routes_the_best_guess() -> None:
    seen, _ = await _route_unsure({})
    assert set(seen) == {"retrieve"}
    decision = decode_routed(seen["retrieve"]).decision
    assert decision.layer == "fallback"


async def test_an_envelope_that_does_not_decode_is_reported_not_retried() -> None:
    stage = build_stage(ClassifierSettings(common=COMMON, heads_dir=""))
    bus, store = RecordingBus(), FakeStore()
    delivery = FakeDelivery(b'{"request": 42}')
    await stage.handle(delivery, deps_for(Cascade(), store, bus))
    (payload,) = bus.on("intentroute.invalid")
    chunk = decode_chunk(payload)
    assert chunk.error is not None
    assert chunk.error.code == "BAD_ENVELOPE"
    assert not delivery.nacked
    assert store.rows == []


async def test_only_the_gateways_trust_stamp_lets_a_declared_type_through() -> None:
    stage = build_stage(ClassifierSettings(common=COMMON, heads_dir=""))
    decided = {}
    for trusted in (True, False):
        bus = RecordingBus()
        env = Admitted(request=AgentRequest(request_id="d-1", session_id="s", agent_id="a",
                                            query="cuántas llamadas llevo este mes?",
                                            query_type="RETRIEVAL"),
                       accepted_at=0.0, trusted=trusted)
        await stage.handle(FakeDelivery(stamped(env)), deps_for(Cascade(), FakeStore(), bus))
        ((_, _, _, payload),) = bus.sent
        decided[trusted] = decode_routed(payload).decision
    assert (decided[True].type, decided[True].layer) == (QueryType.RETRIEVAL, "declared")
    assert (decided[False].type, decided[False].layer) == (QueryType.PLATFORM, "rules")
    assert decided[False].declared_ignored
    assert not decided[True].declared_ignored
