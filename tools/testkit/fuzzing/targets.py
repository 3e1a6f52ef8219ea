"""The fuzz targets: every subject's decoder and every stage handler, each with the
strategy of its input and the check of one example (`Verdict`).

Handler targets drive one message through the stage as the consumer would (a nacked
message is delivered again, up to `max_deliver`) with fresh fakes per example, and
judge what was published (`oracle.judge`). Decoder targets check the decoder's own
contract: the gateway's decoder returns a request every stage can answer or a typed
refusal; an envelope or chunk that decodes can be encoded and decoded back unchanged
(so the stage holding it can hand it on).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import cache
from typing import Any

import msgspec
from hypothesis import strategies as st
from opentelemetry.trace import NoOpTracer

from services.classifier.cascade import Cascade
from services.classifier.handlers import ClassifierDeps
from services.classifier.handlers import build_stage as classifier_stage
from services.classifier.settings import ClassifierSettings
from services.gateway.handlers import GatewayDeps, admitter
from services.gateway.handlers import build_stage as gateway_stage
from services.gateway.settings import GatewaySettings
from services.generator.handlers import GeneratorDeps
from services.generator.handlers import build_stage as generator_stage
from services.generator.settings import GeneratorSettings
from services.retriever.handlers import RetrieverDeps
from services.retriever.handlers import build_stage as retriever_stage
from services.retriever.settings import RetrieverSettings
from services.validator.handlers import ValidatorDeps
from services.validator.handlers import build_stage as validator_stage
from services.validator.parser_client import GuardedParser
from services.validator.settings import ValidatorSettings
from shared.auth.admission import Admission
from shared.auth.ports import AgentInfo
from shared.common.settings import CommonSettings
from shared.contracts.codec import decode_admitted, decode_chunk, decode_routed, encode
from shared.contracts.errors import InvalidInputError
from shared.contracts.ids import is_valid_id
from shared.contracts.pipeline import (
    CLASSIFY_SUBJECT,
    RETRIEVE_SUBJECT,
    VALIDATE_SUBJECT,
    Admitted,
    Routed,
    generate_subject,
)
from shared.contracts.request import AgentRequest, agent_of, request_subject
from shared.contracts.response import ChunkKind, ErrorInfo, ResponseChunk
from shared.contracts.routing import ModelSlot, QueryType
from shared.llm.fleet import Fleet
from shared.llm.walk import Walker
from shared.policy.agent import AgentPolicy, ClarityPolicy
from shared.runtime.stage import Stage, StageDeps
from testkit.fakes import (
    FakeAgents,
    FakeDelivery,
    FakePolicies,
    FakeStore,
    HashedLabeler,
    HashedLayer2,
    InProcessParser,
    PromptEchoBackend,
    RecordingBus,
    ScriptedRetrieval,
)
from testkit.fuzzing import strategies as fz
from testkit.fuzzing.example import Example, Target
from testkit.fuzzing.feedback_targets import FEEDBACK, FEEDBACK_TARGETS
from testkit.fuzzing.oracle import (
    TYPED_CODES,
    Caller,
    Outcome,
    Verdict,
    judge,
    readable_request_id,
    request_problem,
)

# Few deliveries: a retried deterministic failure is already a finding on the first.
COMMON = CommonSettings(nats_url="nats://unused:4222", max_deliver=3)
ADMISSION = Admission(b"fuzzing")
AGENTS = FakeAgents(AgentInfo("a"), AgentInfo("ide", trusted=True),
                    AgentInfo("gone", revoked=True), AgentInfo("asker"))
# Agents a stage sees: ordinary ones, one whose clarity policy is "ask"; or hostile ids.
STAGE_AGENTS = st.one_of(st.sampled_from(["a", "ide", "asker"]), fz.valid_id())
HOSTILE_AGENTS = st.one_of(STAGE_AGENTS, fz.hostile_id())


@cache
def _deliveries() -> st.SearchStrategy[int]:
    return st.one_of(st.just(1), st.just(1), st.just(1), st.integers(2, COMMON.max_deliver))


@cache
def _fault() -> st.SearchStrategy[int]:
    """Mostly none; else the publish at which the connection drops (a stage publishes
    one to a few messages: mostly the 1st to 3rd)."""
    return st.one_of(st.just(0), st.just(0), st.just(0), st.integers(1, 3), st.integers(1, 8))


@st.composite
def _delivery(draw: st.DrawFn) -> dict[str, Any]:
    """The first delivery's number and fault; a faulted one is never the last allowed
    (after that, a lost message is the dead-letter stream's, not an answer)."""
    fault = draw(_fault())
    deliveries = 1 if fault else draw(_deliveries())
    return {"deliveries": deliveries, "fault": fault}


def _store(ex: Example) -> FakeStore:
    return FakeStore(history=list(ex.history), previous=ex.previous, turns=list(ex.turns))


def _base(ex: Example) -> dict[str, Any]:
    return {"bus": RecordingBus(), "store": _store(ex), "tracer": NoOpTracer(),
            "admission": ADMISSION}


async def drive(stage: Stage[Any, Any], deps: StageDeps, ex: Example) -> Outcome:
    """The message through the stage as its consumer hands it over: redelivered after a
    nack (as JetStream would) until the stage's last delivery; with `ex.fault`, the bus
    connection drops at that publish of the first delivery and the message is delivered
    again (as JetStream does after ack_wait, to another replica)."""
    assert isinstance(deps.bus, RecordingBus)
    bus = deps.bus
    outcome = Outcome(bus=bus)
    attempt = ex.deliveries
    while True:
        delivery = FakeDelivery(ex.data, ex.subject, attempt)
        outcome.deliveries.append(delivery)
        if ex.fault and attempt == ex.deliveries:
            bus.drop_at(ex.fault)
        try:
            await stage.handle(delivery, deps)
        except Exception as exc:  # what escapes run_stage reaches the consumer
            if not bus.tripped:
                outcome.raised = exc
                return outcome
        finally:
            delivery.faulted = bus.tripped
            bus.heal()
        redeliver = delivery.nacked or (delivery.faulted and not delivery.settled)
        if not redeliver or attempt >= stage.spec.max_deliver:
            return outcome
        attempt += 1


def stage_caller(decode: Callable[[bytes], Admitted | Routed], data: bytes) -> Caller | None:
    """The caller a stage can answer: an envelope that decodes, whose ids can make a
    subject and which carries the gateway's admission."""
    try:
        env = decode(data)
    except Exception:
        return None
    req = env.request
    if not all(is_valid_id(i) for i in (req.agent_id, req.request_id, req.session_id)):
        return None
    if not ADMISSION.admits(env):
        return None
    return Caller(req.agent_id, req.request_id)


@dataclass(frozen=True)
class Handler:
    """A stage with the fakes of one example and the caller its input names."""

    stage: Stage[Any, Any]
    deps: Callable[[Example], StageDeps]
    caller: Callable[[Example], Caller | None]

    async def run(self, ex: Example) -> tuple[Outcome, Verdict]:
        outcome = await drive(self.stage, self.deps(ex), ex)
        return outcome, judge(outcome, self.caller(ex), ADMISSION)

    async def check(self, ex: Example) -> Verdict:
        return (await self.run(ex))[1]


def _routed_caller(ex: Example) -> Caller | None:
    return stage_caller(decode_routed, ex.data)


# ------------------------------------------------------------------------ handlers

GATEWAY = gateway_stage(GatewaySettings(common=COMMON))


@st.composite
def _gateway_examples(draw: st.DrawFn) -> Example:
    # Mostly agents that may ask (so requests reach the hand-off); revoked, unknown too.
    known = st.sampled_from(["a", "a", "a", "ide", "ide", "gone", "nobody"])
    agent = draw(st.one_of(known, known, known, known, fz.valid_id()))
    return Example(request_subject(agent), draw(fz.agent_request_bytes(agent)),
                   **draw(_delivery()))


def _gateway_caller(ex: Example) -> Caller:
    """The subject's agent, always; the request id when the body names one."""
    rid, exact = readable_request_id(ex.data)
    return Caller(agent_of(ex.subject), rid, exact)


CLASSIFIER = classifier_stage(ClassifierSettings(common=COMMON, heads_dir=""))


# Per-agent policies as the workers' cache serves them: one agent asks when unsure
# (with its own threshold), one prefers an explicit error to the extractive answer.
POLICIES = {
    "asker": AgentPolicy(clarity_policy=ClarityPolicy.ASK, clarity_threshold=0.8),
    "ide": AgentPolicy(fallback={"main": ["m2", "error"], "conversational": ["extractive"]}),
}


# With Layer 2, with Layers 2 and 3, with rules only (picked by the example's length).
_CASCADES = (Cascade(layer2=HashedLayer2()), Cascade(layer2=HashedLayer2(),
                                                      llm=HashedLabeler()), Cascade())


@cache
def _request(kind: str) -> st.SearchStrategy[AgentRequest]:
    """"valid": usable ids, content the gateway lets through; "refused": content it
    refuses; "ids": hostile ids."""
    if kind == "ids":
        return fz.agent_request(HOSTILE_AGENTS, fz.hostile_id(), admissible=False)
    return fz.agent_request(STAGE_AGENTS, fz.valid_id(), admissible=kind == "valid")


@cache
def _admitted(kind: str) -> st.SearchStrategy[Admitted]:
    hostile = kind != "valid"
    return st.builds(Admitted, request=_request(kind), accepted_at=fz.accepted_at(hostile),
                     timings=fz.timings(hostile), trusted=st.booleans(),
                     deadline=fz.deadline(hostile))


@cache
def _routed(types: tuple[QueryType, ...], kind: str) -> st.SearchStrategy[Routed]:
    hostile = kind != "valid"
    return st.builds(
        Routed, request=_request(kind), accepted_at=fz.accepted_at(hostile),
        decision=fz.decision(types), passages=fz.passages(),
        retrieval_query=st.just("") | fz.plain_text(), retrieval_retried=st.booleans(),
        answer=st.just("") | fz.avap_answer(), answered_by=st.sampled_from(
            ["", "extractive", "echo:m", "ollama:qwen"]) if not hostile else fz.hostile_text(30),
        parser_feedback=st.just("") | fz.hostile_text(), attempt=st.sampled_from([0, 0, 1])
        | fz.hostile_int(), seq=st.just(0) | st.integers(0, 20) | fz.hostile_int(),
        timings=fz.timings(hostile), deadline=fz.deadline(hostile))


_KINDS = ("valid", "refused", "ids")


def _admitted_bytes() -> st.SearchStrategy[bytes]:
    return fz.envelope_bytes({k: _admitted(k) for k in _KINDS}, ADMISSION)


def _routed_bytes(*types: QueryType) -> st.SearchStrategy[bytes]:
    return fz.envelope_bytes({k: _routed(types, k) for k in _KINDS}, ADMISSION)


@cache
def _knobs(name: str) -> st.SearchStrategy[dict[str, Any]]:
    """What the store and adapters hold for this stage's example (only what it reads)."""
    knobs: dict[str, st.SearchStrategy[Any]] = {
        "classify": st.fixed_dictionaries({"history": fz.history().map(tuple)}),
        "retrieve": st.fixed_dictionaries({"turns": fz.turns().map(tuple),
                                           "extra_passages": fz.passages(2).map(tuple)}),
        "generate": st.fixed_dictionaries({"backend": st.booleans(),
                                           "previous": st.just("") | fz.plain_text(300)}),
        "validate": st.fixed_dictionaries({"parser": st.booleans()}),
    }
    return knobs.get(name, st.just({}))


@st.composite
def _stage_examples(draw: st.DrawFn, subject: str, envelopes: st.SearchStrategy[bytes],
                    knobs: str = "") -> Example:
    return Example(subject, draw(envelopes), **draw(_delivery()), **draw(_knobs(knobs)))


def _generator_deps(ex: Example) -> GeneratorDeps:
    walker = Walker.single(PromptEchoBackend(), "m") if ex.backend else Walker(Fleet(), {})
    return GeneratorDeps(**_base(ex), walker=walker, model="echo/m" if ex.backend else "",
                         policies=FakePolicies(POLICIES))


HANDLERS: dict[str, Handler] = {
    "gateway": Handler(GATEWAY, lambda ex: GatewayDeps(**_base(ex), agents=AGENTS,
                                                    feedback=FEEDBACK),
                       _gateway_caller),
    "classify": Handler(
        CLASSIFIER,
        lambda ex: ClassifierDeps(**_base(ex), cascade=_CASCADES[len(ex.data) % 3],
                                  policies=FakePolicies(POLICIES)),
        lambda ex: stage_caller(decode_admitted, ex.data)),
    "retrieve": Handler(
        retriever_stage(RetrieverSettings(common=COMMON, relevance_mode="embedding")),
        lambda ex: RetrieverDeps(**_base(ex),
                                 retrieval=ScriptedRetrieval(list(ex.extra_passages))),
        _routed_caller),
    **{f"generate.{slot.value}": Handler(
        generator_stage(GeneratorSettings(common=COMMON, slot=slot)), _generator_deps,
        _routed_caller) for slot in ModelSlot},
    "validate": Handler(
        validator_stage(ValidatorSettings(common=COMMON)),
        lambda ex: ValidatorDeps(**_base(ex), checker=GuardedParser(
            InProcessParser() if ex.parser else None)),
        _routed_caller),
}


# ------------------------------------------------------------------------ decoders

DECODE_REQUEST = admitter(COMMON.request_deadline)


async def check_request_decoder(ex: Example) -> Verdict:
    """The gateway's decoder: an Admitted every stage can answer, or InvalidInputError
    with a typed code and an id answers can be addressed to; nothing else."""
    agent = agent_of(ex.subject)
    try:
        env = DECODE_REQUEST(FakeDelivery(ex.data, ex.subject))
    except InvalidInputError as error:
        if error.code not in TYPED_CODES:
            return Verdict(untyped=f"refused with code {error.code!r}")
        if error.request_id and not is_valid_id(error.request_id):
            return Verdict(unanswered=f"refusal addressed to request id {error.request_id!r}")
        return Verdict()
    except Exception as exc:
        return Verdict(crashed=f"decoder raised {exc!r}")
    problem = request_problem(env.request, agent)
    if not problem and not (math.isfinite(env.deadline) and env.deadline > env.accepted_at):
        problem = f"deadline {env.deadline!r} for a request accepted at {env.accepted_at!r}"
    return Verdict(unanswered=problem)


def _round_trip(decode: Callable[[bytes], Any]
                ) -> Callable[[Example], Coroutine[Any, Any, Verdict]]:
    async def check(ex: Example) -> Verdict:
        try:
            value = decode(ex.data)
        except Exception:
            return Verdict()  # does not decode: the stage reports it (handler targets)
        try:
            again = decode(encode(value))
        except Exception as exc:
            return Verdict(crashed=f"decoded, but cannot be handed on: {exc!r}")
        if again != value:
            return Verdict(crashed="decoded, but changes when handed on")
        return Verdict()

    return check


def _chunks() -> st.SearchStrategy[ResponseChunk]:
    return st.builds(
        ResponseChunk, request_id=fz.hostile_id(), seq=fz.hostile_int(),
        text=fz.hostile_text(), kind=st.sampled_from(list(ChunkKind)), is_final=st.booleans(),
        query_type=fz.hostile_text(20), validation_status=fz.hostile_text(20),
        error=st.none() | st.builds(ErrorInfo, fz.hostile_text(20), fz.hostile_text()),
        decision=st.none() | fz.decision(tuple(QueryType)), avap_code=fz.hostile_text(),
        answered_by=fz.hostile_text(20), retried=st.booleans())


@st.composite
def _chunk_examples(draw: st.DrawFn) -> Example:
    mode = draw(st.sampled_from(["valid"] * 3 + ["broken", "bytes"]))
    if mode == "bytes":
        return Example("agent.response.a.r", draw(st.binary(max_size=600)))
    raw = msgspec.json.encode(draw(_chunks()))
    return Example("agent.response.a.r", draw(fz.broken(raw)) if mode == "broken" else raw)


RETRIEVING = (QueryType.RETRIEVAL, QueryType.CODE_GENERATION)
TARGETS: list[Target] = [
    Target("decode.request", _gateway_examples(), check_request_decoder,
           "agent.request.<agent>: the gateway's decoder", kind="decoder"),
    Target("decode.admitted", _stage_examples(CLASSIFY_SUBJECT, _admitted_bytes()),
           _round_trip(decode_admitted), "intentroute.stage.classify envelopes",
           kind="decoder"),
    Target("decode.routed", _stage_examples(RETRIEVE_SUBJECT, _routed_bytes(*QueryType)),
           _round_trip(decode_routed), "retrieve / generate / validate envelopes",
           kind="decoder"),
    Target("decode.chunk", _chunk_examples(), _round_trip(decode_chunk),
           "agent.response chunks (clients, redelivery checks)", kind="decoder"),
    Target("gateway", _gateway_examples(), HANDLERS["gateway"].check,
           "agent.request.<agent>"),
    Target("classify", _stage_examples(CLASSIFY_SUBJECT, _admitted_bytes(), "classify"),
           HANDLERS["classify"].check, "intentroute.stage.classify"),
    Target("retrieve", _stage_examples(RETRIEVE_SUBJECT, _routed_bytes(*RETRIEVING),
                                       "retrieve"),
           HANDLERS["retrieve"].check, "intentroute.stage.retrieve"),
    Target("generate.main", _stage_examples(generate_subject(ModelSlot.MAIN),
                                            _routed_bytes(*RETRIEVING), "generate"),
           HANDLERS["generate.main"].check, "intentroute.stage.generate.main"),
    Target("generate.conversational", _stage_examples(
        generate_subject(ModelSlot.CONVERSATIONAL),
        _routed_bytes(QueryType.CONVERSATIONAL, QueryType.PLATFORM), "generate"),
        HANDLERS["generate.conversational"].check,
        "intentroute.stage.generate.conversational"),
    Target("validate", _stage_examples(VALIDATE_SUBJECT, _routed_bytes(
        QueryType.CODE_GENERATION), "validate"), HANDLERS["validate"].check,
        "intentroute.stage.validate"),
    *FEEDBACK_TARGETS,
]
