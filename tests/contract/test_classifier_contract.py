"""Contract tier, classifier: an `Admitted` envelope in, a routed hand-off or a
clarification out."""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.trace import NoOpTracer

from services.classifier.cascade import Cascade
from services.classifier.handlers import ClassifierDeps, build_stage
from services.classifier.settings import ClassifierSettings
from shared.contracts.codec import decode_chunk, decode_routed
from shared.contracts.pipeline import Admitted
from shared.contracts.request import AgentRequest
from shared.contracts.routing import HistoryEntry, QueryType
from shared.policy.agent import AgentPolicy, ClarityPolicy
from shared.runtime.stage import history_row
from shared.store.rows import HistoryRow
from testkit.fakes import FakePolicies, FakeStore, RecordingBus
from testkit.wire import ADMISSION, COMMON, run_on_wire


def deps_for(cascade: Cascade, store: FakeStore, bus: RecordingBus,
             policies: FakePolicies | None = None) -> ClassifierDeps:
    return ClassifierDeps(bus=bus, store=store, tracer=NoOpTracer(),
        admission=ADMISSION, cascade=cascade, policies=policies or FakePolicies())


async def test_classifier_routes_platform_past_the_retriever_despite_history() -> None:
    stage = build_stage(ClassifierSettings(common=COMMON, heads_dir=""))
    bus = RecordingBus()
    store = FakeStore(history=[HistoryEntry(QueryType.RETRIEVAL, "what is addVar")] * 5)
    env = Admitted(
        request=AgentRequest(request_id="p-1", session_id="s", agent_id="a",
                             query="cuántas llamadas llevo este mes?"),
        accepted_at=0.0,
    )
    await run_on_wire(stage, env, deps_for(Cascade(), store, bus))

    assert bus.subjects() == [
        ("intentroute.stage.generate.conversational", "INTENTROUTE_PIPELINE")]
    assert bus.sent[0][2] == "a:p-1::classified"  # agent:request:run:step (no run here)
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
    def __init__(self, confidence: float = 0.5) -> None:
        self.confidence = confidence

    async def predict(self, text: str) -> Unsure:
        return Unsure(confidence=self.confidence)


ASK = AgentPolicy(clarity_policy=ClarityPolicy.ASK)


async def _route_unsure(
    policies: dict[str, AgentPolicy], *, agent: str = "widget", confidence: float = 0.5,
    settings: ClassifierSettings | None = None,
) -> tuple[dict[str, bytes], FakeStore, FakePolicies]:
    settings = settings or ClassifierSettings(common=COMMON, heads_dir="")
    bus, store, table = RecordingBus(), FakeStore(), FakePolicies(policies)
    env = Admitted(request=AgentRequest(request_id="u-1", session_id="s", agent_id=agent,
                                        query="tell me about the thing"), accepted_at=0.0)
    await run_on_wire(build_stage(settings), env,
                      deps_for(Cascade(layer2=UnsureLayer2(confidence)), store, bus, table))
    seen = {"retrieve" if subj == "intentroute.stage.retrieve" else
            "answer" if subj == f"agent.response.{agent}.u-1" else subj: payload
            for subj, _, _, payload in bus.sent}
    return seen, store, table


async def test_clarity_policy_ask_answers_with_options_and_generates_nothing() -> None:
    seen, store, table = await _route_unsure({"widget": ASK})
    assert set(seen) == {"answer"}
    chunk = decode_chunk(seen["answer"])
    assert chunk.is_final
    assert chunk.kind == "clarification"
    assert chunk.decision is not None
    assert chunk.decision.clarity == "needs_clarification"
    assert "RETRIEVAL" in chunk.text
    assert "CODE_GENERATION" in chunk.text
    assert store.kinds() == ["HistoryRow", "RequestLogRow"]
    # The policy is looked up per request: the seam of an A/B share.
    assert table.lookups == [("widget", "u-1")]


async def test_clarity_policy_proceed_routes_the_best_guess() -> None:
    seen, _, _ = await _route_unsure({})
    assert set(seen) == {"retrieve"}
    decision = decode_routed(seen["retrieve"]).decision
    assert decision.layer == "fallback"


async def test_an_agents_clarity_policy_does_not_reach_other_agents() -> None:
    seen, _, _ = await _route_unsure({"widget": ASK}, agent="other")
    assert set(seen) == {"retrieve"}


async def test_the_agents_policy_wins_over_the_global_clarity_policy() -> None:
    asking = ClassifierSettings(common=COMMON, heads_dir="", clarity_policy=ClarityPolicy.ASK)
    proceeding = {"widget": AgentPolicy(clarity_policy=ClarityPolicy.PROCEED)}
    seen, _, _ = await _route_unsure(proceeding, settings=asking)
    assert set(seen) == {"retrieve"}
    seen, _, _ = await _route_unsure(proceeding, agent="other", settings=asking)
    assert set(seen) == {"answer"}


async def test_a_per_agent_clarity_threshold_changes_a_borderline_messages_routing() -> None:
    """0.7 is above the global clarity threshold (0.65): the message needs confirmation
    only and goes on with the best guess. Below an agent's threshold of 0.75 it needs
    clarification, and that agent (policy `ask`) is asked back; an agent without a
    policy asking too (global `ask`) is not."""
    careful = {"careful": AgentPolicy(clarity_threshold=0.75, clarity_policy=ClarityPolicy.ASK)}
    asking = ClassifierSettings(common=COMMON, heads_dir="", clarity_policy=ClarityPolicy.ASK)

    seen, _, _ = await _route_unsure(careful, agent="careful", confidence=0.7)
    assert set(seen) == {"answer"}
    chunk = decode_chunk(seen["answer"])
    assert chunk.kind == "clarification"
    assert chunk.decision is not None
    assert chunk.decision.clarity == "needs_clarification"

    seen, _, _ = await _route_unsure(careful, agent="other", confidence=0.7, settings=asking)
    assert set(seen) == {"retrieve"}
    decision = decode_routed(seen["retrieve"]).decision
    assert decision.clarity == "needs_confirmation"
    assert {a.type for a in decision.alternatives} >= {QueryType.CODE_GENERATION}

    # A lower threshold than the global one: this agent is asked less.
    relaxed = {"relaxed": AgentPolicy(clarity_threshold=0.4)}
    seen, _, _ = await _route_unsure(relaxed, agent="relaxed", settings=asking)
    assert set(seen) == {"retrieve"}
    assert decode_routed(seen["retrieve"]).decision.clarity == "needs_confirmation"
    seen, _, _ = await _route_unsure(relaxed, agent="other", settings=asking)
    assert set(seen) == {"answer"}


async def test_an_envelope_that_does_not_decode_is_reported_not_retried() -> None:
    stage = build_stage(ClassifierSettings(common=COMMON, heads_dir=""))
    bus, store = RecordingBus(), FakeStore()
    _, delivery = await run_on_wire(stage, b'{"request": 42}', deps_for(Cascade(), store, bus))
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
        await run_on_wire(stage, env, deps_for(Cascade(), FakeStore(), bus))
        ((_, _, _, payload),) = bus.sent
        decided[trusted] = decode_routed(payload).decision
    assert (decided[True].type, decided[True].layer) == (QueryType.RETRIEVAL, "declared")
    assert (decided[False].type, decided[False].layer) == (QueryType.PLATFORM, "rules")
    assert decided[False].declared_ignored
    assert not decided[True].declared_ignored
