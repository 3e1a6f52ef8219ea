"""The stage template (shared.runtime.stage.run_stage) through one stage: what every stage does
with expired work, retries, redeliveries of answered requests and unusable ids."""

from __future__ import annotations

import time

from opentelemetry.trace import NoOpTracer

from services.retriever.handlers import RetrieverDeps, build_stage
from services.retriever.ports import SearchResult
from services.retriever.settings import RetrieverSettings
from shared.contracts.codec import decode_chunk, encode
from shared.contracts.pipeline import Routed
from shared.contracts.routing import QueryType
from testkit.fakes import FakeStore, RecordingBus, Sent
from testkit.wire import ADMISSION, COMMON, request, routed_decision, run_on_wire


class Searches:
    def __init__(self, *, fail: bool = False) -> None:
        self.fail = fail
        self.queries: list[str] = []

    async def search(self, query: str, k: int) -> SearchResult:
        self.queries.append(query)
        if self.fail:
            raise ConnectionError("index unreachable")
        return SearchResult(passages=[], method="bm25")

    async def maybe_reload(self) -> bool:
        return False

    async def close(self) -> None:
        pass


def setup(*, fail: bool = False, bus: RecordingBus | None = None
          ) -> tuple[RecordingBus, FakeStore, Searches, RetrieverDeps]:
    bus, store, searches = bus or RecordingBus(), FakeStore(), Searches(fail=fail)
    deps = RetrieverDeps(bus=bus, store=store, tracer=NoOpTracer(), admission=ADMISSION,
                         retrieval=searches)
    return bus, store, searches, deps


def envelope(rid: str, *, deadline: float = 0.0, **req: str) -> Routed:
    return Routed(request=request(rid, "what does addVar do", **req), accepted_at=time.time(),
                  decision=routed_decision(QueryType.RETRIEVAL), deadline=deadline)


STAGE = build_stage(RetrieverSettings(common=COMMON, relevance_mode="off"))


async def test_expired_work_is_answered_deadline_exceeded_and_not_done() -> None:
    bus, store, searches, deps = setup()
    _, delivery = await run_on_wire(STAGE, envelope("x-1", deadline=time.time() - 1), deps)
    (chunk,) = bus.chunks("x-1")
    assert chunk.error is not None
    assert chunk.error.code == "DEADLINE_EXCEEDED"
    assert searches.queries == []
    assert store.kinds() == ["RequestLogRow", "HistoryRow"]
    assert not delivery.nacked


async def test_a_retryable_failure_is_retried_until_the_deadline_then_answered() -> None:
    bus, _, _, deps = setup(fail=True)
    _, early = await run_on_wire(STAGE, envelope("r-1", deadline=time.time() + 60), deps)
    assert early.nacked == [0.2]  # backoff, well before the deadline
    assert bus.chunks("r-1") == []
    _, late = await run_on_wire(STAGE, envelope("r-2", deadline=time.time() + 0.1), deps,
                                deliveries=3)
    (chunk,) = bus.chunks("r-2")
    assert chunk.error is not None
    assert chunk.error.code == "DEADLINE_EXCEEDED"
    assert late.nacked == []
    assert [stage for stage, _ in late.dead_lettered] == ["retrieve"]


async def test_the_last_allowed_delivery_is_answered_and_dead_lettered() -> None:
    bus, _, _, deps = setup(fail=True)
    _, last = await run_on_wire(STAGE, envelope("l-1", deadline=time.time() + 60), deps,
                                deliveries=STAGE.spec.max_deliver)
    (chunk,) = bus.chunks("l-1")
    assert chunk.error is not None
    assert chunk.error.code == "STAGE_FAILED"
    assert len(last.dead_lettered) == 1


async def test_a_redelivery_after_the_answer_went_out_is_dropped() -> None:
    bus = RecordingBus()
    env = envelope("d-1")
    # The final of the envelope's run (msg id <agent>:<request>:final:<run>, run "").
    bus.sent.append(Sent("agent.response.a.d-1", "AGENT_RESPONSES", "a:d-1:final:",
                         encode(decode_chunk(b'{"request_id":"d-1","seq":3,"is_final":true}'))))
    _, _, searches, deps = setup(bus=bus)
    await run_on_wire(STAGE, env, deps, deliveries=2)
    assert searches.queries == []
    assert len(bus.sent) == 1  # nothing handed off, nothing answered again


async def test_ids_no_subject_can_be_built_from_are_reported_not_answered() -> None:
    bus, store, searches, deps = setup()
    for rid in ("a.b", "x*", "_invalid", "r" * 129):
        await run_on_wire(STAGE, envelope(rid), deps)
    codes = [decode_chunk(p).error.code for p in bus.on("intentroute.invalid")]  # type: ignore[union-attr]
    assert codes == ["INVALID_FIELD"] * 4
    assert [s for s, _ in bus.subjects()] == ["intentroute.invalid"] * 4
    assert searches.queries == []
    assert store.rows == []


async def test_a_redelivery_of_a_new_run_of_a_used_request_id_is_answered() -> None:
    """The final stored on the subject is an earlier run's (the agent used the request
    id before): this run has not been answered, so its redelivery is not dropped."""
    bus = RecordingBus()
    env = envelope("d-2")
    env.run = "12"
    bus.sent.append(Sent("agent.response.a.d-2", "AGENT_RESPONSES", "a:d-2:final:7",
                         encode(decode_chunk(b'{"request_id":"d-2","seq":3,"is_final":true}'))))
    _, _, searches, deps = setup(bus=bus)
    await run_on_wire(STAGE, env, deps, deliveries=2)
    assert searches.queries == ["what does addVar do"]
