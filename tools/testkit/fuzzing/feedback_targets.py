"""The fuzz targets of `agent.feedback.<agent>` (ADR-0006): the verdict's decoder and the
gateway's feedback consumer, fed arbitrary bytes and hostile verdicts (unknown outcomes,
grades outside 0..10, negative latencies, ids a subject cannot hold) on hostile subjects
(no agent, an empty or reserved one, `*`, whitespace, past the id's bound)."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import msgspec
from hypothesis import strategies as st
from opentelemetry.trace import NoOpTracer

from services.gateway.feedback_recorder import FeedbackRecorder, build_feedback_consumer
from services.gateway.handlers import GatewayDeps
from shared.auth.admission import Admission
from shared.auth.ports import AgentInfo
from shared.common.settings import CommonSettings
from shared.contracts.checks import check_feedback, decode_feedback
from shared.contracts.feedback import (
    SUBJECT_PREFIX,
    Feedback,
    FeedbackAck,
    FeedbackOutcome,
    agent_of,
    feedback_subject,
)
from shared.contracts.ids import MAX_ID_CHARS
from shared.store.feedback_table import Recorded
from testkit.fakes import FakeAgents, FakeDelivery, FakeStore, RecordingBus
from testkit.fuzzing import strategies as fz
from testkit.fuzzing.example import Example, Target
from testkit.fuzzing.oracle import (
    TYPED_CODES,
    Outcome,
    Verdict,
    ack_problem,
    feedback_problem,
    judge_feedback,
)

COMMON = CommonSettings(nats_url="nats://unused:4222", max_deliver=3)
AGENTS = FakeAgents(AgentInfo("a"), AgentInfo("ide", trusted=True),
                    AgentInfo("gone", revoked=True))


class FeedbackTable:
    """The feedback table: some request ids are the agent's, the others unknown."""

    async def record_explicit(self, agent_id: str, feedback: Feedback) -> Recorded:
        return Recorded(stored=len(feedback.request_id) % 2 == 0, previous="")


FEEDBACK = FeedbackRecorder(FeedbackTable(), unknown_retries=())
CONSUMER = build_feedback_consumer(COMMON, max_inflight=1)

# Subjects whose agent part is not an id (or that are not feedback subjects at all).
HOSTILE_SUBJECTS = [
    f"{SUBJECT_PREFIX}.", f"{SUBJECT_PREFIX}..x", f"{SUBJECT_PREFIX}.a b", f"{SUBJECT_PREFIX}.*",
    f"{SUBJECT_PREFIX}.>", f"{SUBJECT_PREFIX}.a.b", f"{SUBJECT_PREFIX}._invalid",
    f"{SUBJECT_PREFIX}._feedback", f"{SUBJECT_PREFIX}.a\n", f"{SUBJECT_PREFIX}.\x00",
    f"{SUBJECT_PREFIX}.{'a' * (MAX_ID_CHARS + 1)}", SUBJECT_PREFIX, "agent.feedbackx.a",
    "agent.request.a", "",
]
# Numbers JSON can spell that Python's json module does not write.
RAW_NUMBERS = [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400", b"1" + b"0" * 400,
               b"10.000000000000002", b"-0.0", b"1e-400"]
_RAW = "\x01raw\x01"


def _weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """One of `choices` by weight (st.one_of flattens nested one_ofs into equal branches:
    hostile_id's many branches would swamp the ordinary ones)."""
    return st.sampled_from([s for n, s in choices for _ in range(n)]).flatmap(lambda s: s)


@cache
def _subjects() -> st.SearchStrategy[str]:
    """Mostly known agents (so verdicts reach the recorder), else any id or none."""
    return _weighted(
        (6, st.sampled_from(["a", "a", "a", "ide", "gone", "nobody"]).map(feedback_subject)),
        (1, fz.valid_id().map(feedback_subject)), (2, st.sampled_from(HOSTILE_SUBJECTS)),
        (1, fz.hostile_id().map(feedback_subject)))


@cache
def _grades() -> st.SearchStrategy[Any]:
    """completion_quality: in 0..10 mostly, else just outside, huge, spelled raw, or
    not a number."""
    return _weighted((4, st.floats(0, 10)), (1, st.integers(0, 10)), (2, st.sampled_from(
        [-0.0, -1e-9, 10.0, 10.0001, 11, -1, 1e308])), (1, fz.hostile_float()),
        (1, st.just(_RAW)), (1, fz.json_values()))


@cache
def _metadata() -> st.SearchStrategy[Any]:
    fields = st.fixed_dictionaries({}, optional={
        "completion_quality": _grades(),
        "latency_ms": _weighted((5, st.floats(0, 1e6)), (1, st.sampled_from(
            [-1, -0.0, -1e-300])), (1, fz.hostile_float()), (1, st.just(_RAW)),
            (1, fz.json_values())),
        "token_count": _weighted((5, st.integers(0, 10_000)), (1, fz.hostile_int()),
                                 (1, st.just(_RAW)), (1, fz.json_values())),
    })
    return st.one_of(fields, fields, fields, fz.json_values())


@cache
def _bodies() -> st.SearchStrategy[dict[str, Any]]:
    outcomes = _weighted(
        (6, st.sampled_from([o.value for o in FeedbackOutcome])),
        (1, st.sampled_from(["SUCCESS", "", "unknown", " success", "success\x00"])),
        (1, fz.hostile_text(30)), (1, fz.json_values()))
    ids = _weighted((6, fz.valid_id()), (3, fz.hostile_id()), (1, fz.json_values()))
    return st.fixed_dictionaries({}, optional={
        "request_id": ids, "outcome": outcomes, "metadata": _metadata(),
        "agent_id": fz.hostile_id(), "extra": fz.json_values()})


@st.composite
def feedback_bytes(draw: st.DrawFn) -> bytes:
    """A verdict's body: mostly one shaped like the contract (hostile values, a raw
    number now and then), else broken JSON or arbitrary bytes."""
    mode = draw(st.sampled_from(["shaped"] * 6 + ["broken", "bytes"]))
    if mode == "bytes":
        return draw(st.binary(max_size=400))
    body = draw(_bodies())
    if mode == "shaped" and len(body) >= 2:  # most reach the recorder: complete them
        body.setdefault("request_id", draw(fz.valid_id()))
        body.setdefault("outcome", "success")
    raw = json.dumps(body, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    while json.dumps(_RAW).encode() in raw:
        raw = raw.replace(json.dumps(_RAW).encode(), draw(st.sampled_from(RAW_NUMBERS)), 1)
    return draw(fz.broken(raw)) if mode == "broken" else raw


@st.composite
def _examples(draw: st.DrawFn) -> Example:
    return Example(draw(_subjects()), draw(feedback_bytes()),
                   deliveries=draw(st.sampled_from([1, 1, 1, COMMON.max_deliver])))


async def check_decoder(ex: Example) -> Verdict:
    """decode_feedback then check_feedback (what every entry point does): a verdict in
    bounds that encodes and decodes back unchanged, or a typed refusal whose request id
    is empty or one a subject can hold; never an exception."""
    try:
        decoded = decode_feedback(ex.data)
        ack = decoded if isinstance(decoded, FeedbackAck) else check_feedback(decoded)
    except Exception as exc:
        return Verdict(crashed=f"decoder raised {exc!r}")
    if ack is not None:
        unanswered, untyped = ack_problem(ack)
        if ack.accepted:
            unanswered = unanswered or "the decoder's refusal says accepted"
        try:
            msgspec.json.encode(ack)
        except Exception as exc:
            return Verdict(crashed=f"the refusal cannot be sent: {exc!r}")
        return Verdict(unanswered=unanswered, untyped=untyped,
                       end=f"error:{ack.error_code}" if ack.error_code in TYPED_CODES else "")
    assert isinstance(decoded, Feedback)
    problem = feedback_problem(decoded)
    if not problem:
        try:
            again = msgspec.json.decode(msgspec.json.encode(decoded), type=Feedback)
        except Exception as exc:
            return Verdict(crashed=f"decoded, but cannot be stored or sent: {exc!r}")
        problem = "" if again == decoded else "decoded, but changes when encoded again"
    return Verdict(unanswered=problem, end="answer")


async def check_consumer(ex: Example) -> Verdict:
    """The gateway's feedback consumer handler on one delivery (fresh bus per example)."""
    bus = RecordingBus()
    deps = GatewayDeps(bus=bus, store=FakeStore(), tracer=NoOpTracer(),
                       admission=Admission(b"fuzzing"), agents=AGENTS, feedback=FEEDBACK)
    handler = CONSUMER.bind(deps)
    delivery = FakeDelivery(ex.data, ex.subject, ex.deliveries)
    outcome = Outcome(bus=bus, deliveries=[delivery])
    try:
        await handler(delivery)
    except Exception as exc:  # what escapes the handler reaches the consumer
        outcome.raised = exc
    return judge_feedback(outcome, ex.subject, await AGENTS.get(agent_of(ex.subject)))


FEEDBACK_TARGETS = [
    Target("decode.feedback", _examples(), check_decoder,
           "agent.feedback.<agent>: the verdict's decoder and bounds", kind="decoder"),
    Target("gateway.feedback", _examples(), check_consumer,
           "agent.feedback.<agent>: the gateway's feedback consumer"),
]
