"""Regressions of what fuzzing (tests/fuzz, `intentroute bench fuzz`) found: each input
here once crashed a handler, was retried although it could never succeed, was answered
on the wrong subject or with repeated seqs, or was handed on to a stage that could not
use it."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import msgspec
from opentelemetry.trace import NoOpTracer

from services.classifier.cascade import Cascade
from services.classifier.handlers import ClassifierDeps
from services.classifier.handlers import build_stage as classifier_stage
from services.classifier.settings import ClassifierSettings
from services.gateway.feedback_recorder import build_feedback_consumer
from services.gateway.handlers import GatewayDeps
from services.gateway.handlers import build_stage as gateway_stage
from services.gateway.settings import GatewaySettings
from services.generator.handlers import GeneratorDeps
from services.generator.handlers import build_stage as generator_stage
from services.generator.prompts import ChatMessage
from services.generator.settings import GeneratorSettings
from services.validator.handlers import ValidatorDeps
from services.validator.handlers import build_stage as validator_stage
from services.validator.ports import CheckResult, CheckStatus
from services.validator.settings import ValidatorSettings
from shared.auth.ports import AgentInfo
from shared.contracts.codec import decode_chunk, encode
from shared.contracts.feedback import FeedbackAck
from shared.contracts.pipeline import Admitted, Routed
from shared.contracts.response import ChunkKind, ResponseChunk
from shared.contracts.routing import ModelSlot, QueryType
from shared.llm.fleet import Fleet
from shared.llm.walk import Walker
from shared.store.ports import StoreRejectedError
from shared.store.rows import Row, TurnRow
from testkit.fakes import (
    FakeAgents,
    FakeFeedbackTable,
    FakePolicies,
    FakeStore,
    RecordingBus,
    feedback_recorder,
)
from testkit.wire import ADMISSION, COMMON, request, routed_decision, run_on_wire

GATEWAY = gateway_stage(GatewaySettings(common=COMMON))


async def to_gateway(body: bytes, agent: str = "a") -> tuple[RecordingBus, FakeStore]:
    bus, store = RecordingBus(), FakeStore()
    deps = GatewayDeps(bus=bus, store=store, tracer=NoOpTracer(), admission=ADMISSION,
                       agents=FakeAgents(AgentInfo(agent)), feedback=feedback_recorder())
    _, delivery = await run_on_wire(GATEWAY, body, deps, subject=f"agent.request.{agent}")
    assert not delivery.nacked
    return bus, store


def only_chunk(bus: RecordingBus) -> tuple[str, ResponseChunk]:
    ((subject, _, _, payload),) = bus.sent
    return subject, decode_chunk(payload)


async def test_invalid_utf8_is_answered_on_the_requests_own_subject() -> None:
    bus, _ = await to_gateway(b'{"request_id": "u-1", "session_id": "s", "query": "\xff\xfe"}')
    subject, chunk = only_chunk(bus)
    assert subject == "agent.response.a.u-1"
    assert chunk.error is not None
    assert chunk.error.code == "MALFORMED_JSON"


async def test_json_nested_past_the_decoders_depth_is_answered_on_its_subject() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    bus, _ = await to_gateway(b'{"request_id": "n-1", "x": ' + deep + b', "query": "q"}')
    subject, chunk = only_chunk(bus)
    assert subject == "agent.response.a.n-1"
    assert chunk.error is not None
    assert chunk.error.code == "MALFORMED_JSON"


async def test_a_request_id_with_a_trailing_newline_reaches_no_subject() -> None:
    # `re.match` with `$` let "r-1\n" through: it became a subject token.
    body = {"request_id": "r-1\n", "session_id": "s", "query": "hi"}
    bus, _ = await to_gateway(json.dumps(body).encode())
    subject, chunk = only_chunk(bus)
    assert subject == "agent.response.a._invalid"
    assert chunk.error is not None
    assert chunk.error.code == "INVALID_FIELD"


async def test_over_long_and_reserved_request_ids_do_not_address_an_answer() -> None:
    for rid in ("r" * 129, "_invalid"):
        body = {"request_id": rid, "session_id": "s", "query": ""}
        bus, _ = await to_gateway(json.dumps(body).encode())
        subject, chunk = only_chunk(bus)
        assert subject == "agent.response.a._invalid"
        assert chunk.request_id == ""
        # A core publish: a durable one (msg id `a:_invalid:final`) would be dropped as
        # a duplicate for every other such request within the dedupe window.
        assert bus.sent[0][2] == ""


async def test_nul_characters_are_refused_at_the_gateway() -> None:
    for field in ("query", "extra_context", "editor_context", "user_info"):
        body = {"request_id": "z-1", "session_id": "s", "query": "hi", field: "a\x00b"}
        bus, store = await to_gateway(json.dumps(body).encode())
        subject, chunk = only_chunk(bus)
        assert subject == "agent.response.a.z-1"
        assert chunk.error is not None
        assert chunk.error.code == "INVALID_FIELD"
        assert "NUL" in chunk.error.message
        assert store.kinds() == ["RequestLogRow"]


async def test_a_stamped_envelope_breaking_the_gateways_rules_is_answered_at_once() -> None:
    """Every stage checks the request again: a trusted agent's unknown query_type used to
    crash the classifier (retried until STAGE_FAILED), a NUL character failed the turn's
    write at the end of the pipeline."""
    stage = classifier_stage(ClassifierSettings(common=COMMON, heads_dir=""))
    cases = {"UNKNOWN_QUERY_TYPE": request("q-1", "hi", query_type="BILLING"),
             "INVALID_FIELD": request("q-2", "a\x00b"),
             "MISSING_FIELD": request("q-3", "   ")}
    for code, req in cases.items():
        bus = RecordingBus()
        _, delivery = await run_on_wire(
            stage, Admitted(request=req, accepted_at=time.time(), trusted=True),
            ClassifierDeps(bus=bus, store=FakeStore(), tracer=NoOpTracer(), admission=ADMISSION,
                           cascade=Cascade(), policies=FakePolicies()))
        assert not delivery.nacked
        (chunk,) = bus.chunks(req.request_id)
        assert chunk.error is not None
        assert chunk.error.code == code
        assert bus.on("intentroute.stage.retrieve") == []


async def test_an_envelope_whose_times_are_no_times_is_answered_not_handed_on() -> None:
    # accepted_at -1.8e308 made the stage's timing -inf, encoded as null: the next stage
    # could not decode the hand-off and nobody was answered.
    stage = classifier_stage(ClassifierSettings(common=COMMON, heads_dir=""))
    bus = RecordingBus()
    env = Admitted(request=request("t-1", "how do I loop"), accepted_at=-1.7976931348623157e308)
    await run_on_wire(stage, env, ClassifierDeps(
        bus=bus, store=FakeStore(), tracer=NoOpTracer(), admission=ADMISSION,
        cascade=Cascade(), policies=FakePolicies()))
    (chunk,) = bus.chunks("t-1")
    assert chunk.error is not None
    assert chunk.error.code == "INVALID_FIELD"


async def test_an_envelope_run_that_is_no_subject_token_is_answered_on_run_0() -> None:
    # The run names the answer's claim subject: `1.>` would have been a wildcard there.
    stage = classifier_stage(ClassifierSettings(common=COMMON, heads_dir=""))
    bus = RecordingBus()
    env = Admitted(request=request("t-2", "how do I loop"), accepted_at=time.time(), run="1.>")
    await run_on_wire(stage, env, ClassifierDeps(
        bus=bus, store=FakeStore(), tracer=NoOpTracer(), admission=ADMISSION,
        cascade=Cascade(), policies=FakePolicies()))
    (chunk,) = bus.chunks("t-2")
    assert chunk.error is not None
    assert chunk.error.code == "INVALID_FIELD"
    # Claimed (and marked sent) on run 0, not on a wildcard.
    assert list(bus.claims) == ["intentroute.claim.a.t-2.0", "intentroute.claim.a.t-2.0.sent"]


class RefusingStore(FakeStore):
    """A database that refuses the turn's rows (as Postgres does a value it cannot hold)."""

    def __init__(self) -> None:
        super().__init__(previous="Use addVar(name, value). Then addResult(name).")
        self.refusals = 0

    async def write(self, *rows: Row, deadline: float | None = None) -> None:
        if any(isinstance(r, TurnRow) for r in rows):
            self.refusals += 1
            raise StoreRejectedError("CharacterNotInRepertoireError: invalid byte sequence")
        await super().write(*rows, deadline=deadline)


class Streaming:
    """A model backend that streams its answer in pieces."""

    name = "fake"

    async def stream(self, model: str, messages: list[ChatMessage], *,
                     prefill: str = "") -> AsyncIterator[str]:
        for token in ("Loop ", "with ", "startLoop."):
            yield token


async def test_rows_the_database_refuses_are_answered_once_not_retried() -> None:
    stage = generator_stage(GeneratorSettings(common=COMMON, slot=ModelSlot.CONVERSATIONAL))
    bus, store = RecordingBus(), RefusingStore()
    env = Routed(request=request("s-1", "en menos palabras"), accepted_at=time.time(),
                 decision=routed_decision(QueryType.CONVERSATIONAL))
    _, delivery = await run_on_wire(stage, env, GeneratorDeps(
        bus=bus, store=store, tracer=NoOpTracer(), admission=ADMISSION,
        walker=Walker.single(Streaming(), "m"), model="fake/m", policies=FakePolicies()))
    assert delivery.nacked == []
    assert store.refusals == 1
    chunks = [decode_chunk(s.payload) for s in bus.sent if s.subject == "agent.response.a.s-1"]
    # The error follows what was streamed (seqs increase), after a reset of that text.
    assert [c.kind for c in chunks] == ["text", "text", "reset", "final"]
    assert [c.seq for c in chunks] == [0, 1, 2, 3]
    assert chunks[-1].error is not None
    assert chunks[-1].error.code == "STAGE_FAILED"


async def test_nul_characters_in_an_answer_are_not_what_fails_its_turn() -> None:
    stage = generator_stage(GeneratorSettings(common=COMMON, slot=ModelSlot.CONVERSATIONAL))
    bus, store = RecordingBus(), FakeStore(previous="Use addVar\x00 twice.")
    env = Routed(request=request("a-1", "en menos palabras"), accepted_at=time.time(),
                 decision=routed_decision(QueryType.CONVERSATIONAL))
    await run_on_wire(stage, env, GeneratorDeps(
        bus=bus, store=store, tracer=NoOpTracer(), admission=ADMISSION,
        walker=Walker(Fleet(), {}), model="", policies=FakePolicies()))
    (turn,) = [r for r in store.rows if isinstance(r, TurnRow)]
    assert "\x00" not in turn.answer
    assert "addVar" in turn.answer


async def test_a_redelivered_validation_goes_on_after_what_was_stored() -> None:
    """A validator that died after its status chunk sent it again with the same seq."""

    class Valid:
        enabled = True

        async def check(self, code: str) -> CheckResult:
            return CheckResult(CheckStatus.VALID)

    stage = validator_stage(ValidatorSettings(common=COMMON))
    bus = RecordingBus(stored_seq=1)  # the first delivery's status chunk, seq 0
    env = Routed(request=request("v-1", "write a loop"), accepted_at=time.time(),
                 decision=routed_decision(QueryType.CODE_GENERATION),
                 answer="```avap\naddVar(x, 1)\n```", answered_by="fake:m")
    await run_on_wire(stage, env, ValidatorDeps(
        bus=bus, store=FakeStore(), tracer=NoOpTracer(), admission=ADMISSION,
        checker=Valid()), deliveries=2)
    chunks = bus.chunks("v-1")
    assert chunks[0].kind == "reset"
    assert [c.seq for c in chunks] == list(range(1, 1 + len(chunks)))
    assert chunks[-1].is_final
    assert chunks[-1].avap_code == "addVar(x, 1)"


async def test_a_redelivery_sends_the_answer_an_earlier_delivery_claimed() -> None:
    """Two different finals of one request: the earlier delivery (cut off after its
    claim) and its redelivery, answering again. The redelivery sends the claimed one."""
    class Unused:
        enabled = True

        async def check(self, code: str) -> CheckResult:
            raise AssertionError("a claimed answer is not validated again")

    stage = validator_stage(ValidatorSettings(common=COMMON))
    bus = RecordingBus()
    claimed = encode(ResponseChunk(request_id="v-2", seq=0, text="the first answer",
                                   kind=ChunkKind.FINAL, is_final=True))
    bus.claims["intentroute.claim.a.v-2.8"] = claimed
    env = Routed(request=request("v-2", "write a loop"), accepted_at=time.time(),
                 decision=routed_decision(QueryType.CODE_GENERATION), run="8",
                 answer="```avap\naddVar(x, 1)\n```", answered_by="fake:m")
    outcome, _ = await run_on_wire(stage, env, ValidatorDeps(
        bus=bus, store=FakeStore(), tracer=NoOpTracer(), admission=ADMISSION,
        checker=Unused()), deliveries=2)
    assert outcome == "duplicate"
    assert bus.on("agent.response.a.v-2") == [claimed]


async def test_a_stamp_with_non_ascii_characters_is_refused_not_raised() -> None:
    # hmac.compare_digest raised TypeError on it: the message was retried, then
    # dead-lettered, never reported.
    stage = classifier_stage(ClassifierSettings(common=COMMON, heads_dir=""))
    bus = RecordingBus()
    env = Admitted(request=request("f-1", "hi"), accepted_at=time.time(), admission="é" * 64)
    wire = json.dumps(msgspec.to_builtins(env)).encode()
    _, delivery = await run_on_wire(stage, wire, ClassifierDeps(
        bus=bus, store=FakeStore(), tracer=NoOpTracer(), admission=ADMISSION,
        cascade=Cascade(), policies=FakePolicies()))
    assert not delivery.nacked
    (payload,) = bus.on("intentroute.invalid")
    report = decode_chunk(payload)
    assert report.error is not None
    assert report.error.code == "NOT_ADMITTED"


FEEDBACK_CONSUMER = build_feedback_consumer(COMMON, max_inflight=1)


async def to_feedback(body: bytes, subject: str = "agent.feedback.a",
                      agents: tuple[AgentInfo, ...] = (AgentInfo("a"),)
                      ) -> tuple[str, FeedbackAck]:
    """One feedback message through the gateway's consumer: its only publish, the ack."""
    bus = RecordingBus()
    deps = GatewayDeps(bus=bus, store=FakeStore(), tracer=NoOpTracer(), admission=ADMISSION,
                       agents=FakeAgents(*agents),
                       feedback=feedback_recorder(FakeFeedbackTable(("a", "f-1"))))
    _, delivery = await run_on_wire(FEEDBACK_CONSUMER, body, deps, subject=subject)
    assert not delivery.nacked
    assert not delivery.dead_lettered
    ((ack_subject, _, _, payload),) = bus.sent
    return ack_subject, msgspec.json.decode(payload, type=FeedbackAck)


async def test_feedback_nested_past_the_decoders_depth_is_refused_not_raised() -> None:
    # decode_feedback caught DecodeError only: RecursionError escaped the consumer's
    # handler (the message was retried, then dead-lettered, never acknowledged); the
    # HTTP endpoint answered 500.
    deep = b"[" * 100_000 + b"]" * 100_000
    subject, ack = await to_feedback(
        b'{"request_id": "f-1", "x": ' + deep + b', "outcome": "success"}')
    assert subject == "agent.response.a._feedback.f-1"
    assert not ack.accepted
    assert ack.error_code == "MALFORMED_JSON"


async def test_feedback_of_an_unknown_agent_is_acked_on_its_request_id_past_4_kib() -> None:
    # The unknown-agent refusal salvaged the request id from the body's first 4 KiB
    # only: a verdict naming it later was refused on `_feedback._invalid`.
    body = {"metadata": {"." * 5_000: 1}, "request_id": "f-1", "outcome": "success"}
    subject, ack = await to_feedback(json.dumps(body).encode(), "agent.feedback.nobody")
    assert subject == "agent.response.nobody._feedback.f-1"
    assert (ack.request_id, ack.accepted, ack.error_code) == ("f-1", False, "UNKNOWN_AGENT")
