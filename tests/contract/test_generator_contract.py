"""Contract tier, generator: a `Routed` envelope in, an answer streamed (or code handed to
the validator) out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from opentelemetry.trace import NoOpTracer

from services.generator.handlers import GeneratorDeps, build_stage
from services.generator.ports import ChatBackend, TokenCounts
from services.generator.prompts import ChatMessage
from services.generator.settings import GeneratorSettings
from shared.client.caller import assemble
from shared.contracts.codec import decode_routed
from shared.contracts.pipeline import Passage, Routed
from shared.contracts.routing import ModelSlot, QueryType
from shared.llm.faults import Fault, ModelError
from shared.llm.fleet import Fleet
from shared.llm.walk import Walker
from shared.policy.agent import AgentPolicy
from shared.store.rows import RequestLogRow, TurnRow
from testkit.fakes import FakePolicies, FakeStore, RecordingBus
from testkit.wire import ADMISSION, COMMON, request, routed_decision, run_on_wire


class Scripted:
    """A model backend that streams the given tokens and the counts it is given, then
    fails if told to; the models in `failing` fail before their first token."""

    name = "fake"

    def __init__(self, *tokens: str, fail_after: bool = False, failing: tuple[str, ...] = (),
                 counts: TokenCounts | None = None, delay: float = 0.0) -> None:
        self.tokens = tokens
        self.delay = delay
        self.fail_after = fail_after
        self.failing = failing
        self.counts = counts
        self.calls: list[list[ChatMessage]] = []
        self.models: list[str] = []

    async def stream(self, model: str, messages: list[ChatMessage], *, prefill: str = ""
                     ) -> AsyncIterator[str | TokenCounts]:
        self.calls.append(messages)
        self.models.append(model)
        if model in self.failing:
            raise ModelError(Fault.REFUSED, f"model {model!r} not found")
        for token in self.tokens:
            if self.delay:
                await asyncio.sleep(self.delay)
            yield token
        if self.fail_after:
            raise ModelError(Fault.CUT, "connection reset")
        if self.counts is not None:
            yield self.counts


def deps_for(bus: RecordingBus, store: FakeStore, backend: ChatBackend | None,
             policies: dict[str, AgentPolicy] | None = None) -> GeneratorDeps:
    walker = Walker.single(backend, "m") if backend else Walker(Fleet(), {})
    return GeneratorDeps(bus=bus, store=store, tracer=NoOpTracer(), admission=ADMISSION,
                         walker=walker, model="fake/m" if backend else "",
                         policies=FakePolicies(policies))


def conversational(rid: str) -> Routed:
    return Routed(request=request(rid, "en menos palabras"), accepted_at=0.0,
                  decision=routed_decision(QueryType.CONVERSATIONAL))


async def test_conversational_answer_streams_and_the_turn_is_stored_first() -> None:
    bus, store = RecordingBus(), FakeStore(previous="Use startLoop(i, 1, 5) and endLoop().")
    stage = build_stage(GeneratorSettings(common=COMMON, slot=ModelSlot.CONVERSATIONAL))
    assert stage.spec.subject == "intentroute.stage.generate.conversational"
    backend = Scripted("Loop ", "with ", "startLoop.")
    await run_on_wire(stage, conversational("v-1"), deps_for(bus, store, backend))

    chunks = bus.chunks("v-1")
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert sum(c.is_final for c in chunks) == 1
    assert chunks[-1].is_final
    assert assemble(chunks) == "Loop with startLoop."
    assert chunks[-1].answered_by == "fake/m"
    assert chunks[-1].query_type == "CONVERSATIONAL"
    # The previous answer reached the prompt.
    assert "startLoop(i, 1, 5)" in backend.calls[0][0].content
    assert store.kinds() == ["HistoryRow", "TurnRow", "RequestLogRow"]
    turn = store.rows[1]
    assert isinstance(turn, TurnRow)
    assert turn.answer == "Loop with startLoop."
    log_row = store.rows[2]
    assert isinstance(log_row, RequestLogRow)
    assert log_row.outcome == "ok"
    assert "generate.conversational" in log_row.stage_ms


async def test_code_is_collected_and_handed_to_the_validator_not_streamed() -> None:
    bus, store = RecordingBus(), FakeStore()
    env = Routed(request=request("g-1", "write a loop"), accepted_at=0.0,
                 decision=routed_decision(QueryType.CODE_GENERATION),
                 passages=[Passage("d", "Loops", "startLoop(i, 1, 5)", 1.0)])
    stage = build_stage(GeneratorSettings(common=COMMON, slot=ModelSlot.MAIN))
    await run_on_wire(stage, env,
                      deps_for(bus, store, Scripted("```avap\n", "addResult(1)\n```")))

    assert bus.subjects() == [("intentroute.stage.validate", "INTENTROUTE_PIPELINE")]
    assert bus.sent[0][2] == "a:g-1::generated:0"  # agent:request:run:step (no run here)
    out = decode_routed(bus.sent[0][3])
    assert out.answer == "```avap\naddResult(1)\n```"
    assert out.answered_by == "fake/m"
    assert "generate.main" in out.timings
    assert store.rows == []


async def test_a_backend_failing_mid_answer_restarts_it_extractively() -> None:
    bus, store = RecordingBus(), FakeStore(previous="Use addVar(name, value).")
    stage = build_stage(GeneratorSettings(common=COMMON, slot=ModelSlot.CONVERSATIONAL))
    await run_on_wire(stage, conversational("x-1"),
                      deps_for(bus, store, Scripted("half ", "an ", "answer", fail_after=True)))
    chunks = bus.chunks("x-1")
    assert "reset" in [c.kind for c in chunks]
    assert chunks[-1].answered_by == "extractive"
    assert "half an" not in assemble(chunks)


async def test_a_redelivered_answer_resets_after_what_was_already_stored() -> None:
    bus, store = RecordingBus(stored_seq=3), FakeStore(previous="Use addVar(name, value).")
    stage = build_stage(GeneratorSettings(common=COMMON, slot=ModelSlot.CONVERSATIONAL))
    await run_on_wire(stage, conversational("r-1"), deps_for(bus, store, None), deliveries=2)
    chunks = bus.chunks("r-1")
    assert chunks[0].kind == "reset"
    assert chunks[0].seq == 3
    assert [c.seq for c in chunks] == list(range(3, 3 + len(chunks)))
    assert chunks[-1].is_final
    assert chunks[-1].answered_by == "extractive"


async def test_a_named_model_must_be_the_agents_to_choose_and_the_fleets() -> None:
    """The generator holds the fleet: a model the request names that the agent's policy
    lists but the fleet does not serve (or that the policy stopped listing since the
    gateway admitted it) is a typed UNKNOWN_MODEL before any model is asked."""
    stage = build_stage(GeneratorSettings(common=COMMON, slot=ModelSlot.CONVERSATIONAL))
    policies = {"a": AgentPolicy(models=["fake/m", "fake/gone"])}
    outcomes = {}
    for rid, model, agent_policies in (("named", "fake/m", policies),
                                       ("unserved", "fake/gone", policies),
                                       ("unlisted", "fake/m", {})):
        bus, store, backend = RecordingBus(), FakeStore(previous="x"), Scripted("Hi.")
        env = Routed(request=request(rid, "en menos palabras", model=model), accepted_at=0.0,
                     decision=routed_decision(QueryType.CONVERSATIONAL))
        await run_on_wire(stage, env, deps_for(bus, store, backend, agent_policies))
        final = bus.chunks(rid)[-1]
        outcomes[rid] = (final.error.code if final.error else final.answered_by,
                         len(backend.calls))
    assert outcomes == {"named": ("fake/m", 1), "unserved": ("UNKNOWN_MODEL", 0),
                        "unlisted": ("UNKNOWN_MODEL", 0)}
