"""What one example must end as, judged from what the stage published.

A message ends in exactly one of:
* one final chunk, on the caller's response subject (`agent.response.<agent>.<request>`
  when its ids can be read, the agent's `_invalid` subject from the gateway when the
  request id cannot), after every other chunk of that subject and with increasing seqs;
* one hand-off to a stage subject (re-publishes with the same msg id are the designed
  no-op), whose envelope the next stage can read and admit;
* one report on `intentroute.invalid`, only when no caller can be read.
Any error carries a code of `ErrorCode`. A handler that raises, or nacks or
dead-letters although no fake failed (the bus's injected connection loss aside), has
crashed on its input.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise

import msgspec

from shared.auth.admission import Admission
from shared.auth.ports import AgentInfo
from shared.contracts import pipeline, response
from shared.contracts.codec import decode_admitted, decode_chunk, decode_routed
from shared.contracts.feedback import (
    INVALID_ACK_ID,
    MAX_QUALITY,
    Feedback,
    FeedbackAck,
    FeedbackOutcome,
    ack_subject,
)
from shared.contracts.feedback import agent_of as feedback_agent_of
from shared.contracts.ids import is_valid_id
from shared.contracts.pipeline import Admitted, Routed
from shared.contracts.request import MAX_CONTEXT_CHARS, MAX_QUERY_CHARS, AgentRequest
from shared.contracts.response import (
    INTERNAL_INVALID_SUBJECT,
    INVALID_REQUEST_ID,
    ErrorCode,
    ResponseChunk,
)
from shared.contracts.routing import QueryType
from testkit.fakes import FakeDelivery, RecordingBus, Sent

TYPED_CODES = frozenset(c.value for c in ErrorCode)


@dataclass(frozen=True)
class Verdict:
    """One example's judgement: each field says what went wrong ("" if nothing)."""

    crashed: str = ""
    unanswered: str = ""
    untyped: str = ""
    # How the message ended: "handoff", "answer", "error:<code>", "report:<code>", "none".
    end: str = "none"

    @property
    def ok(self) -> bool:
        return not (self.crashed or self.unanswered or self.untyped)

    def __str__(self) -> str:
        parts = [f"{k}: {v}" for k, v in (("crash", self.crashed), ("unanswered",
                 self.unanswered), ("untyped error", self.untyped)) if v]
        return "; ".join(parts) or "ok"


@dataclass(frozen=True)
class Caller:
    """Who may be answered: the agent always (from the subject at the gateway), the
    request id when it can be read. `exact`: the answer must go to that request id."""

    agent_id: str
    request_id: str = ""
    exact: bool = True


@dataclass
class Outcome:
    """What driving one message did: its deliveries (redelivered after a nack, as
    JetStream would, up to the stage's max_deliver) and what was published."""

    bus: RecordingBus
    deliveries: list[FakeDelivery] = field(default_factory=list)
    raised: BaseException | None = None


def request_problem(req: AgentRequest, agent_id: str) -> str:
    """Why an accepted request could not be answered and stored ("" if it can)."""
    for name in ("agent_id", "request_id", "session_id"):
        if not is_valid_id(getattr(req, name)):
            return f"{name} {getattr(req, name)!r} cannot make a subject"
    if req.agent_id != agent_id:
        return f"agent {req.agent_id!r} is not the subject's {agent_id!r}"
    if not req.query.strip():
        return "empty query accepted"
    texts = {"query": req.query, "extra_context": req.extra_context,
             "user_info": req.user_info, "editor_context": req.editor_context}
    for name, text in texts.items():
        if "\x00" in text:
            return f"{name} holds a NUL character the database refuses"
        bound = MAX_QUERY_CHARS if name == "query" else MAX_CONTEXT_CHARS
        if len(text) > bound:
            return f"{name} over {bound} characters accepted"
    if req.query_type and req.query_type not in QueryType.__members__:
        return f"query_type {req.query_type!r} accepted"
    return ""


def _chunks(bus: RecordingBus, subject: str) -> list[ResponseChunk]:
    return [decode_chunk(s.payload) for s in bus.sent if s.subject == subject]


def _response_token(subject: str) -> tuple[str, str] | None:
    """(agent, request token) of a well-formed response subject."""
    parts = subject.split(".")
    if len(parts) != 4 or f"{parts[0]}.{parts[1]}" != response.SUBJECT_PREFIX:
        return None
    return parts[2], parts[3]


def _check_final(bus: RecordingBus, sent: Sent, caller: Caller | None) -> str:
    chunk = decode_chunk(sent.payload)
    token = _response_token(sent.subject)
    if token is None:
        return f"answer on a malformed subject {sent.subject!r}"
    agent, rid = token
    if caller is None:
        return f"answered {sent.subject!r} though no caller could be read"
    if agent != caller.agent_id:
        return f"answered agent {agent!r}, the caller is {caller.agent_id!r}"
    if rid == INVALID_REQUEST_ID:
        if caller.request_id and caller.exact:
            return f"answered on _invalid, the request id {caller.request_id!r} was readable"
        if chunk.request_id:
            return f"an _invalid answer names request id {chunk.request_id!r}"
    else:
        if not is_valid_id(rid):
            return f"answered on request token {rid!r}, not a valid id"
        if caller.exact and caller.request_id and rid != caller.request_id:
            return f"answered request {rid!r}, the caller's is {caller.request_id!r}"
        if chunk.request_id != rid:
            return f"final chunk names {chunk.request_id!r} on {rid!r}'s subject"
    chunks = _chunks(bus, sent.subject)
    if chunks[-1] != chunk:
        return "chunks published after the final one"
    seqs = [c.seq for c in chunks]
    if any(b <= a for a, b in pairwise(seqs)):
        return f"chunk seqs not increasing: {seqs[:10]}"
    return ""


def _check_handoff(sent: Sent, caller: Caller | None, admission: Admission) -> str:
    if caller is None:
        return f"handed off to {sent.subject} though no caller could be read"
    decode: Callable[[bytes], Admitted | Routed] = (
        decode_admitted if sent.subject == pipeline.CLASSIFY_SUBJECT else decode_routed)
    try:
        env = decode(sent.payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return f"the next stage cannot read the hand-off to {sent.subject}: {exc}"
    req = env.request
    if req.agent_id != caller.agent_id or req.request_id != (
            caller.request_id or req.request_id):
        return f"hand-off carries {req.agent_id}/{req.request_id}, not the caller's"
    problem = request_problem(req, caller.agent_id)
    if problem:
        return f"hand-off the next stage cannot answer: {problem}"
    if not admission.admits(env):
        return "hand-off without a valid admission stamp"
    if not sent.msg_id.startswith(f"{req.agent_id}:{req.request_id}:"):
        return f"hand-off msg id {sent.msg_id!r} is not the request's"
    return ""


def judge(outcome: Outcome, caller: Caller | None, admission: Admission) -> Verdict:
    """The verdict on one driven message; `caller` is read from the input by the target
    (None: nobody can be answered, the message must be reported)."""
    crashed = _crashed(outcome)
    bus = outcome.bus
    finals: list[Sent] = []
    handoffs: dict[str, Sent] = {}
    reports: list[Sent] = []
    stray: list[str] = []
    untyped = ""
    for sent in bus.sent:
        if sent.subject.startswith(response.SUBJECT_PREFIX + "."):
            chunk = decode_chunk(sent.payload)
            if chunk.is_final:
                finals.append(sent)
            if chunk.error is not None and chunk.error.code not in TYPED_CODES:
                untyped = f"error code {chunk.error.code!r} on {sent.subject}"
        elif sent.subject == INTERNAL_INVALID_SUBJECT:
            reports.append(sent)
            chunk = decode_chunk(sent.payload)
            if chunk.error is None or chunk.error.code not in TYPED_CODES:
                untyped = f"report without a typed code: {chunk.error!r}"
        elif sent.subject.startswith(pipeline.SUBJECT_PREFIX + "."):
            handoffs.setdefault(sent.msg_id, sent)
        else:
            stray.append(sent.subject)
    ends = len(finals) + len(handoffs) + len(reports)
    unanswered = ""
    end = _end(finals, handoffs, reports)
    if stray:
        unanswered = f"published on unexpected subjects {stray[:3]}"
    elif ends != 1:
        unanswered = (f"{ends} ends: {len(finals)} final chunks, {len(handoffs)} hand-offs, "
                      f"{len(reports)} reports")
    elif finals:
        unanswered = _check_final(bus, finals[0], caller)
    elif handoffs:
        unanswered = _check_handoff(next(iter(handoffs.values())), caller, admission)
    elif caller is not None:
        unanswered = (f"reported on {INTERNAL_INVALID_SUBJECT} though {caller.agent_id}/"
                      f"{caller.request_id} could be answered")
    return Verdict(crashed=crashed, unanswered=unanswered, untyped=untyped, end=end)


def _crashed(outcome: Outcome) -> str:
    """Why the handler failed the message ("" if it did not): it raised, or a delivery
    without an injected fault was retried or dead-lettered (a deterministic failure)."""
    if outcome.raised is not None:
        return f"handler raised {outcome.raised!r}"
    if any((d.nacked or d.dead_lettered) and not d.faulted for d in outcome.deliveries):
        reasons = [r for d in outcome.deliveries for _, r in d.dead_lettered]
        return f"retried a deterministic failure ({len(outcome.deliveries)} deliveries) " + (
            "; ".join(reasons)[:300])
    return ""


def _end(finals: list[Sent], handoffs: dict[str, Sent], reports: list[Sent]) -> str:
    if handoffs:
        return "handoff"
    for sent, kind in [*((f, "error") for f in finals), *((r, "report") for r in reports)]:
        error = decode_chunk(sent.payload).error
        return f"{kind}:{error.code}" if error else "answer"
    return "none"


def readable_request_id(data: bytes) -> tuple[str, bool]:
    """The request id a JSON body names, if it is one answers can be addressed to, and
    whether it is unambiguous (named once)."""
    names: list[object] = []

    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        names.extend(v for k, v in items if k == "request_id")
        return dict(items)

    try:
        body = json.loads(data, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return "", False
    if not isinstance(body, dict):
        return "", False
    rid = body.get("request_id")
    if isinstance(rid, str) and is_valid_id(rid):
        return rid, len(names) == 1
    return "", False


# ---- agent.feedback.<agent>: one ack on the agent's `_feedback` subject --------------

_INT4_MAX = 2**31 - 1


def feedback_problem(fb: Feedback) -> str:
    """Why a decoded verdict must not be accepted ("" if it may be stored)."""
    if not is_valid_id(fb.request_id):
        return f"request_id {fb.request_id!r} cannot make a subject"
    if fb.outcome not in set(FeedbackOutcome):
        return f"outcome {fb.outcome!r} accepted"
    meta = fb.metadata
    quality = meta.completion_quality
    if quality is not None and not (math.isfinite(quality) and 0 <= quality <= MAX_QUALITY):
        return f"completion_quality {quality!r} accepted"
    if meta.latency_ms is not None and not (math.isfinite(meta.latency_ms)
                                            and meta.latency_ms >= 0):
        return f"latency_ms {meta.latency_ms!r} accepted"
    if meta.token_count is not None and not 0 <= meta.token_count <= _INT4_MAX:
        return f"token_count {meta.token_count!r} accepted (int4 column)"
    return ""


def ack_problem(ack: FeedbackAck) -> tuple[str, str]:
    """(unanswered, untyped) of one ack taken alone: a refusal names a typed code, an
    acceptance none; its request id is empty or one a subject can hold."""
    untyped = ""
    if not ack.accepted and ack.error_code not in TYPED_CODES:
        untyped = f"refused with code {ack.error_code!r}"
    if ack.accepted and ack.error_code:
        untyped = f"accepted with error code {ack.error_code!r}"
    if ack.request_id and not is_valid_id(ack.request_id):
        return f"ack names request id {ack.request_id!r}", untyped
    return "", untyped


def _ack_token_problem(rid: str, ack: FeedbackAck, fb: Feedback | None) -> str:
    """Why the ack's subject token `rid` is wrong ("" if it is right): `_invalid` only
    when the message's request id was unreadable, else the id the ack names."""
    if rid == INVALID_ACK_ID:
        if ack.request_id:
            return f"ack on _invalid names request id {ack.request_id!r}"
        if fb is not None and is_valid_id(fb.request_id):
            return f"ack on _invalid, the request id {fb.request_id!r} was readable"
        return ""
    if not is_valid_id(rid) or rid != ack.request_id:
        return f"ack for {ack.request_id!r} on request token {rid!r}"
    return ""


def _decoded_feedback(data: bytes) -> Feedback | None:
    try:
        return msgspec.json.decode(data, type=Feedback)
    except Exception:  # anything that does not decode is not a verdict
        return None


def judge_feedback(outcome: Outcome, subject: str, agent: AgentInfo | None) -> Verdict:
    """A feedback message ends in exactly one ack on `agent.response.<agent>._feedback.
    <request id | _invalid>` when the subject's agent can be read (else one report on
    intentroute.invalid, nothing on agent.response.*); a refusal carries an ErrorCode,
    an acceptance only a verdict in bounds from a known agent; the message is acked
    (no raise, nack or dead letter: no fake fails)."""
    crashed = ""
    if outcome.raised is not None:
        crashed = f"handler raised {outcome.raised!r}"
    elif any(d.nacked or d.dead_lettered for d in outcome.deliveries):
        crashed = f"not acknowledged ({len(outcome.deliveries)} deliveries)"
    sent = outcome.bus.sent
    readable = is_valid_id(feedback_agent_of(subject))
    if len(sent) != 1:
        return Verdict(crashed=crashed, unanswered=f"{len(sent)} publishes: "
                       f"{[s.subject[:80] for s in sent[:3]]}")
    only = sent[0]
    if not readable:
        if only.subject != INTERNAL_INVALID_SUBJECT:
            return Verdict(crashed=crashed, unanswered=f"subject {subject!r} has no readable "
                           f"agent, yet published on {only.subject!r}")
        error = decode_chunk(only.payload).error
        code = error.code if error else ""
        return Verdict(crashed=crashed, untyped="" if code in TYPED_CODES else
                       f"report without a typed code: {error!r}", end=f"report:{code}")
    name = feedback_agent_of(subject)
    prefix = ack_subject(name, "")
    if not only.subject.startswith(prefix):
        return Verdict(crashed=crashed, unanswered=f"ack on {only.subject!r}, not {prefix}*")
    rid = only.subject[len(prefix):]
    ack = msgspec.json.decode(only.payload, type=FeedbackAck)
    unanswered, untyped = ack_problem(ack)
    end = "answer" if ack.accepted else f"error:{ack.error_code}"
    fb = _decoded_feedback(outcome.deliveries[0].data)
    if unanswered:
        return Verdict(crashed=crashed, unanswered=unanswered, untyped=untyped, end=end)
    unanswered = _ack_token_problem(rid, ack, fb)
    if not unanswered and ack.accepted:
        if agent is None or agent.revoked:
            unanswered = f"feedback of unknown or revoked agent {name!r} accepted"
        elif fb is None:
            unanswered = "a body that is not a verdict accepted"
        else:
            unanswered = feedback_problem(fb) or (
                "" if fb.request_id == rid else f"accepted {fb.request_id!r} as {rid!r}")
    return Verdict(crashed=crashed, unanswered=unanswered, untyped=untyped, end=end)
