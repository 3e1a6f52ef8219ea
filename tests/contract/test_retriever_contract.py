"""Contract tier, retriever: a `Routed` envelope in, passages handed to the main slot."""

from __future__ import annotations

import msgspec
from opentelemetry.trace import NoOpTracer

from services.retriever.handlers import RetrieverDeps, build_stage
from services.retriever.ports import SearchResult
from services.retriever.settings import RetrieverSettings
from shared.contracts.codec import decode_chunk, decode_routed, encode
from shared.contracts.pipeline import Passage, Routed
from shared.contracts.routing import QueryType
from testkit.fakes import FakeStore, RecordingBus, ScriptedRetrieval
from testkit.wire import ADMISSION, COMMON, request, routed_decision, run_on_wire, stamped

PASSAGE = Passage("loops#1", "Loops > startLoop", "startLoop(i, 1, 5) counts 1..5.", 1.0)


def setup(turns: list[tuple[str, str]] | None = None
          ) -> tuple[RecordingBus, FakeStore, ScriptedRetrieval, RetrieverDeps]:
    bus, store = RecordingBus(), FakeStore(turns=turns)
    retrieval = ScriptedRetrieval(passages=[PASSAGE])
    deps = RetrieverDeps(bus=bus, store=store, tracer=NoOpTracer(),
        admission=ADMISSION, retrieval=retrieval)
    return bus, store, retrieval, deps


def settings() -> RetrieverSettings:
    return RetrieverSettings(common=COMMON, relevance_mode="off")


async def test_code_request_is_handed_to_the_main_slot_with_its_passages() -> None:
    bus, store, retrieval, deps = setup()
    env = Routed(request=request("c-1", "write a loop from 1 to 5 with startLoop"),
                 accepted_at=0.0, decision=routed_decision(QueryType.CODE_GENERATION))
    await run_on_wire(build_stage(settings()), env, deps)

    assert bus.subjects() == [("intentroute.stage.generate.main", "INTENTROUTE_PIPELINE")]
    assert bus.sent[0][2] == "a:c-1::retrieved"  # agent:request:run:step (no run here)
    out = decode_routed(bus.sent[0][3])
    assert out.passages == [PASSAGE]
    assert out.retrieval_query == env.request.query
    assert not out.retrieval_retried
    assert {"retrieve", "retrieve.at"} <= set(out.timings)
    assert retrieval.reloads == 1
    assert store.rows == []


async def test_follow_up_is_searched_with_the_previous_question() -> None:
    bus, _, retrieval, deps = setup(turns=[("user", "how do I declare a variable with addVar"),
                                           ("assistant", "Use addVar(name, value).")])
    env = Routed(request=request("f-1", "and in a loop?"), accepted_at=0.0,
                 decision=routed_decision(QueryType.RETRIEVAL))
    await run_on_wire(build_stage(settings()), env, deps)
    (query,) = retrieval.queries
    assert "addVar" in query
    assert "loop" in query
    assert decode_routed(bus.sent[0][3]).retrieval_query == query


async def test_platform_request_reaching_the_retriever_is_answered_rc04() -> None:
    bus, store, retrieval, deps = setup()
    env = Routed(request=request("p-1", "how is my quota"), accepted_at=0.0,
                 decision=routed_decision(QueryType.PLATFORM))
    _, delivery = await run_on_wire(build_stage(settings()), env, deps)

    assert retrieval.queries == []
    (chunk,) = bus.chunks("p-1")
    assert chunk.is_final
    assert chunk.error is not None
    assert chunk.error.code == "RC04_VIOLATION"
    assert chunk.query_type == "PLATFORM"
    assert store.kinds() == ["RequestLogRow", "HistoryRow"]
    assert not delivery.nacked  # a permanent error is answered, not retried


async def test_a_failing_search_is_retried_then_answered_on_the_last_delivery() -> None:
    class Broken(ScriptedRetrieval):
        async def search(self, query: str, k: int) -> SearchResult:
            raise ConnectionError("index unreachable")

    bus, store = RecordingBus(), FakeStore()
    deps = RetrieverDeps(bus=bus, store=store, tracer=NoOpTracer(),
        admission=ADMISSION, retrieval=Broken())
    env = Routed(request=request("b-1", "what does addVar do"), accepted_at=0.0,
                 decision=routed_decision(QueryType.RETRIEVAL))
    stage = build_stage(settings())
    _, first = await run_on_wire(stage, env, deps, deliveries=1)
    assert first.nacked
    assert bus.sent == []
    _, last = await run_on_wire(stage, env, deps, deliveries=stage.spec.max_deliver)
    (chunk,) = bus.chunks("b-1")
    assert chunk.error is not None
    assert chunk.error.code == "STAGE_FAILED"
    assert not last.nacked


async def test_an_envelope_without_the_gateways_admission_is_dropped() -> None:
    """A forged hand-off (its stamp missing, or made for another agent) answers nobody,
    writes nothing and is acknowledged; it is reported for ops."""
    bus, store, retrieval, deps = setup()
    genuine = Routed(request=request("f-1", "what does addVar do", agent_id="alice"),
                     accepted_at=1.0, decision=routed_decision(QueryType.RETRIEVAL))
    stamped(genuine)
    forged = msgspec.structs.replace(
        genuine, request=msgspec.structs.replace(genuine.request, agent_id="mallory"))
    for env in (Routed(request=genuine.request, accepted_at=1.0, decision=genuine.decision),
                forged):
        _, delivery = await run_on_wire(build_stage(settings()), encode(env), deps)
        assert not delivery.nacked
    assert retrieval.queries == []
    assert store.rows == []
    reports = [decode_chunk(p) for p in bus.on("intentroute.invalid")]
    assert [r.error.code for r in reports if r.error] == ["NOT_ADMITTED", "NOT_ADMITTED"]
    assert [s for s, _ in bus.subjects()] == ["intentroute.invalid"] * 2
