"""Issue 32: a read on the request path that Postgres does not answer within its bound
(StoreReadTimeoutError) holds no answer back. The classifier decides without the intent
history, as on a session's first turn, and marks the decision; a CONVERSATIONAL turn is
answered without the previous answer, marked; the retriever rewrites no follow-up."""

from __future__ import annotations

from opentelemetry.trace import NoOpTracer

from services.classifier.cascade import Cascade
from services.classifier.handlers import ClassifierDeps
from services.classifier.handlers import build_stage as classifier_stage
from services.classifier.settings import ClassifierSettings
from services.generator.handlers import GeneratorDeps
from services.generator.handlers import build_stage as generator_stage
from services.generator.settings import GeneratorSettings
from shared.client.caller import assemble
from shared.contracts.codec import decode_routed
from shared.contracts.pipeline import Admitted, Routed
from shared.contracts.request import AgentRequest
from shared.contracts.routing import HistoryEntry, ModelSlot, QueryType
from shared.llm.fleet import Fleet
from shared.llm.walk import Walker
from shared.store.ports import StoreReadTimeoutError
from testkit.fakes import FakePolicies, FakeStore, RecordingBus
from testkit.wire import ADMISSION, COMMON, request, routed_decision, run_on_wire


class AwayStore(FakeStore):
    """Postgres paused: every request-path read gives up (its rows would still queue)."""

    def __init__(self) -> None:
        super().__init__(history=[HistoryEntry(QueryType.CODE_GENERATION, "a loop")])
        self.reads = 0

    async def last_history(self, agent_id: str, session_id: str, n: int = 6
                           ) -> list[HistoryEntry]:
        self.reads += 1
        raise StoreReadTimeoutError("the intent history not read")

    async def previous_answer(self, agent_id: str, session_id: str) -> str | None:
        self.reads += 1
        raise StoreReadTimeoutError("the previous answer not read")


def admitted(rid: str, query: str) -> Admitted:
    return Admitted(request=AgentRequest(request_id=rid, session_id="s", agent_id="a",
                                         query=query), accepted_at=0.0)


async def classified(store: FakeStore, query: str) -> Routed:
    bus = RecordingBus()
    deps = ClassifierDeps(bus=bus, store=store, tracer=NoOpTracer(), admission=ADMISSION,
                          cascade=Cascade(), policies=FakePolicies())
    await run_on_wire(classifier_stage(ClassifierSettings(common=COMMON, heads_dir="")),
                      admitted("c-1", query), deps)
    (subject, _stream), = bus.subjects()
    return decode_routed(bus.on(subject)[0])


async def test_a_deictic_message_is_decided_without_the_history_and_says_so() -> None:
    away = AwayStore()
    out = await classified(away, "why is it so high?")
    fresh = await classified(FakeStore(), "why is it so high?")
    assert away.reads == 1
    # As a session's first turn is decided (RC-03: the history never predicts a type).
    assert (out.decision.type, out.decision.layer) == (fresh.decision.type,
                                                       fresh.decision.layer)
    assert out.decision.history_unavailable
    assert not out.decision.resolved_reference
    assert not fresh.decision.history_unavailable


async def test_a_message_that_needs_no_history_is_not_marked() -> None:
    away = AwayStore()
    out = await classified(away, "cuántas llamadas llevo este mes?")
    assert away.reads == 0
    assert out.decision.type == QueryType.PLATFORM  # RC-02 from the message alone
    assert not out.decision.history_unavailable


async def test_a_conversational_turn_is_answered_without_the_previous_answer() -> None:
    bus, store = RecordingBus(), AwayStore()
    env = Routed(request=request("v-1", "en menos palabras"), accepted_at=0.0,
                 decision=routed_decision(QueryType.CONVERSATIONAL))
    deps = GeneratorDeps(bus=bus, store=store, tracer=NoOpTracer(), admission=ADMISSION,
                         walker=Walker(Fleet(), {}), model="", policies=FakePolicies())
    await run_on_wire(generator_stage(
        GeneratorSettings(common=COMMON, slot=ModelSlot.CONVERSATIONAL)), env, deps)
    chunks = bus.chunks("v-1")
    assert sum(c.is_final for c in chunks) == 1
    final = chunks[-1]
    assert final.error is None
    assert assemble(chunks)
    assert final.decision is not None
    assert final.decision.type == QueryType.CONVERSATIONAL
    assert final.decision.history_unavailable
    # The turn's rows are written as ever (queued while Postgres is away).
    assert store.kinds() == ["HistoryRow", "TurnRow", "RequestLogRow"]
