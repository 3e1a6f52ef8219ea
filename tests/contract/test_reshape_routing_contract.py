"""Contract tier, classifier (issue 22, item 2): the taxonomy as written. Reshaping or
continuing the previous answer is CONVERSATIONAL whatever the previous turn was, and is
handed to the conversational generator, never to the retriever (RC-04); a pointer at
code or a document in the editor resolves through the editor context (RC-03)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from opentelemetry.trace import NoOpTracer

from services.classifier.cascade import Cascade
from services.classifier.handlers import ClassifierDeps, build_stage
from services.classifier.settings import ClassifierSettings
from shared.contracts.codec import decode_routed
from shared.contracts.pipeline import Admitted
from shared.contracts.request import AgentRequest
from shared.contracts.routing import HistoryEntry, QueryType
from testkit.fakes import FakePolicies, FakeStore, RecordingBus
from testkit.wire import ADMISSION, COMMON, run_on_wire

RETRIEVE = "intentroute.stage.retrieve"
CONVERSATIONAL = "intentroute.stage.generate.conversational"
RESHAPES = ["make it shorter", "in Spanish please", "continue", "now as a table",
            "hazlo más corto", "sigue, por favor", "explain it like I'm five"]


@dataclass(frozen=True)
class Pred:
    label: str
    confidence: float
    alternatives: list[tuple[str, float]]


class SaysType:
    """A Layer 2 that reads every message as the previous turn's type (the anchoring
    the contract forbids), fairly sure of it."""

    def __init__(self, qt: QueryType, p: float = 0.8) -> None:
        self.qt, self.p = qt, p

    async def predict(self, text: str) -> Pred:
        rest = (1 - self.p) / 3
        return Pred(self.qt.value, self.p,
                    [(t.value, rest) for t in QueryType if t is not self.qt])


async def _route(query: str, history: list[HistoryEntry], *, layer2: SaysType | None = None,
                 editor: str = "") -> tuple[list[str], QueryType, FakeStore]:
    bus, store = RecordingBus(), FakeStore(history=history)
    env = Admitted(request=AgentRequest(request_id="x-1", session_id="s", agent_id="a",
                                        query=query, editor_context=editor), accepted_at=0.0)
    await run_on_wire(build_stage(ClassifierSettings(common=COMMON, heads_dir="")), env,
                      ClassifierDeps(bus=bus, store=store, tracer=NoOpTracer(),
                                     admission=ADMISSION, cascade=Cascade(layer2=layer2),
                                     policies=FakePolicies()))
    subjects = [subject for subject, _ in bus.subjects()]
    (payload,) = [p for subj, _, _, p in bus.sent if subj in (RETRIEVE, CONVERSATIONAL)]
    return subjects, decode_routed(payload).decision.type, store


@pytest.mark.parametrize("previous", list(QueryType))
@pytest.mark.parametrize("query", RESHAPES)
async def test_a_reshape_request_is_conversational_after_any_turn(
        previous: QueryType, query: str) -> None:
    history = [HistoryEntry(previous, f"an earlier {previous.value.lower()} turn")]
    subjects, routed, store = await _route(query, history, layer2=SaysType(previous))
    assert routed == QueryType.CONVERSATIONAL
    assert RETRIEVE not in subjects
    assert subjects == [CONVERSATIONAL]
    assert store.history_reads == 0  # what the previous turn was does not matter


async def test_explain_this_with_avap_code_in_the_editor_is_a_code_request() -> None:
    editor = "getListLen(items, n)\naddResult(n)"  # no command the old hint list knew
    subjects, routed, _ = await _route("explain this", [], editor=editor,
                                       layer2=SaysType(QueryType.CONVERSATIONAL, 0.99))
    assert routed == QueryType.CODE_GENERATION
    assert subjects == [RETRIEVE]


async def test_explain_this_with_a_docs_passage_in_the_editor_is_retrieval() -> None:
    passage = "The startLoop command repeats the block up to endLoop, one pass per value."
    subjects, routed, _ = await _route("explain this", [], editor=passage,
                                       layer2=SaysType(QueryType.CONVERSATIONAL, 0.99))
    assert routed == QueryType.RETRIEVAL
    assert subjects == [RETRIEVE]


async def test_a_pointer_without_editor_context_resolves_through_the_history() -> None:
    history = [HistoryEntry(QueryType.PLATFORM, "how many calls this month")]
    _, routed, store = await _route("why is it so high?", history,
                                    layer2=SaysType(QueryType.RETRIEVAL, 0.99))
    assert routed == QueryType.PLATFORM
    assert store.history_reads == 1
