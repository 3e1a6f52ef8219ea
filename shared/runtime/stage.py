"""The one shape every stage has: decode, guard redeliveries, time, call the logic, hand off.

A stage is its delivery settings (`StageSpec`), a decoder for its envelope and a logic
function. `run_stage` does the rest, the same way for every stage:

* an envelope that does not decode is reported (the stage's `on_undecodable`) and
  acknowledged, never retried; one whose ids cannot make a subject, or that lacks the
  gateway's admission, is reported and acknowledged too (there is nobody to answer);
* a redelivered envelope whose answer already went out is dropped, and so is one of
  a split message's part that was handed on to the next part already (its hand-off
  published again: shared.runtime.part_handoffs); one past its deadline is answered
  DEADLINE_EXCEEDED;
* `<stage>.at` records when the stage started (ms after the gateway accepted it);
* the logic returns a `Handoff` (the next subject and envelope) or None when it answered
  the caller itself; a hand-off records the stage's time and is published durably with a
  msg id that makes a re-publish after a crash a no-op;
* an envelope whose request breaks a rule the gateway checks (a NUL character, a bound, an
  unknown query_type) or whose times are no times is answered with the gateway's code;
* errors are either permanent (an `IntentrouteError` that is not `retryable`: a
  `PermanentError`, rows the store refuses, ...: the caller gets a final error chunk
  with its code and the message is acknowledged) or retryable (a retryable one, and
  anything else: nack with backoff so another delivery, possibly on another replica,
  tries again, until the request's deadline; shared.contracts.errors).
  On the last allowed delivery a retryable error becomes an error answer too and the
  message is dead-lettered, so a poison message ends as a reply, never as a loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from opentelemetry.trace import Tracer

from shared.auth.admission import Admission
from shared.common.deadline import bounded_by, time_left
from shared.common.settings import CommonSettings
from shared.contracts.codec import encode
from shared.contracts.errors import IntentrouteError, PermanentError
from shared.contracts.ids import id_problem
from shared.contracts.pipeline import Admitted, Routed, envelope_problem
from shared.contracts.request import AgentRequest
from shared.contracts.response import ErrorCode
from shared.contracts.routing import RoutingDecision
from shared.runtime import part_handoffs
from shared.runtime.answer_stream import ANSWER_LEASE, ANSWER_RUN, AnswerStream, Lease
from shared.runtime.bus import publish_stage
from shared.runtime.consumer import Handler, StageSpec
from shared.runtime.endings import answer_error, finish_turn, history_row, report_invalid
from shared.runtime.logs import log_context
from shared.runtime.ports import Delivery, Publisher
from shared.runtime.signals import Outcome
from shared.runtime.telemetry import annotate
from shared.store.ports import TurnStore

# Re-exported: what a stage's logic calls to end a turn.
__all__ = ["Call", "Decode", "Handoff", "PermanentError", "Stage", "StageDeps", "answer_error",
           "finish_turn", "history_row", "payload", "run_stage", "stage_spec"]

log = logging.getLogger("intentroute.stage")


class Enveloped(Protocol):
    """What every envelope carries: the request, when it was accepted, stage timings."""

    @property
    def request(self) -> AgentRequest: ...

    @property
    def accepted_at(self) -> float: ...

    @property
    def timings(self) -> dict[str, float]: ...


E = TypeVar("E", Admitted, Routed)


@dataclass(kw_only=True)
class StageDeps:
    """What every stage's logic gets: the bus, the store, the tracer, and the exit stack
    that closes whatever the worker opened for it. A stage that needs more subclasses it."""

    bus: Publisher
    store: TurnStore
    tracer: Tracer
    admission: Admission
    exits: AsyncExitStack = field(default_factory=AsyncExitStack)

    def parts(self) -> dict[str, Any]:
        """The base fields, to build a subclass from: `MyDeps(**base.parts(), extra=...)`."""
        return {"bus": self.bus, "store": self.store, "tracer": self.tracer,
                "admission": self.admission, "exits": self.exits}

    async def close(self) -> None:
        await self.exits.aclose()


D = TypeVar("D", bound=StageDeps)


@dataclass(frozen=True)
class Handoff:
    """The next stage's subject and envelope. `step` names the hand-off in its msg id
    (`<request_id>:<step>`); `timing` is the key the stage's time is recorded under."""

    subject: str
    envelope: Admitted | Routed
    step: str
    timing: str = ""


@dataclass
class Call:
    """One delivery being handled: the message and when the stage started on it."""

    delivery: Delivery
    stage: str
    # The request's deadline (epoch seconds, 0: none): calls to models, indexes and the
    # parser are bounded by what is left of it.
    deadline: float = 0.0
    started: float = field(default_factory=time.perf_counter)

    def remaining(self, cap: float) -> float:
        """Seconds a call may take: `cap`, or less if the deadline is nearer."""
        return time_left(cap)

    def elapsed_ms(self) -> float:
        return round((time.perf_counter() - self.started) * 1000, 3)

    def mark(self, env: Enveloped, key: str = "") -> None:
        """Record how long this stage has worked on `env` so far."""
        env.timings[key or self.stage] = self.elapsed_ms()


Logic = Callable[[E, Call, D], Awaitable[Handoff | None]]
Decode = Callable[[Delivery], E]
Undecodable = Callable[[D, Delivery, Exception], Awaitable[None]]


def payload(decoder: Callable[[bytes], E]) -> Decode[E]:
    """A stage decoder that reads the message body only (every stage but the gateway)."""

    def decode(msg: Delivery) -> E:
        return decoder(msg.data)

    return decode


async def report_undecodable(deps: StageDeps, msg: Delivery, exc: Exception) -> None:
    """An envelope no stage can read has no caller to answer: reported and acknowledged."""
    await report_invalid(deps.bus, msg.subject, ErrorCode.BAD_ENVELOPE,
                         f"envelope does not decode: {exc}")


@dataclass(frozen=True)
class Stage(Generic[E, D]):
    """A stage a worker serves: its name, delivery settings, envelope decoder and logic."""

    name: str
    spec: StageSpec
    decode: Decode[E]
    logic: Logic[E, D]
    on_undecodable: Undecodable[D] = report_undecodable
    # Record `<name>.at` (time from acceptance to this stage) and the stage's own time.
    timed: bool = True
    # Check the gateway's admission stamp (every stage but the gateway itself).
    admitted_only: bool = True

    async def handle(self, msg: Delivery, deps: D) -> Outcome:
        return await run_stage(self, msg, deps)

    def bind(self, deps: D) -> Handler:
        async def handler(msg: Delivery) -> Outcome:
            return await run_stage(self, msg, deps)

        return handler


def stage_spec(
    common: CommonSettings, *, stream: str, subject: str, durable: str, max_inflight: int
) -> StageSpec:
    """A stage's delivery settings: its own stream, subject, durable and batch, plus the
    redelivery bounds (`ack_wait`, `max_deliver`) and the `lookahead` every stage takes
    from CommonSettings."""
    return StageSpec(stream=stream, subject=subject, durable=durable, max_inflight=max_inflight,
                     ack_wait=common.ack_wait, max_deliver=common.max_deliver,
                     lookahead=common.stage_lookahead)


async def run_stage(stage: Stage[E, D], msg: Delivery, deps: D) -> Outcome:
    """Decode, check, run the logic, hand off; errors end as answers (module doc).
    Returns how it ended, for the stage's signals (shared.runtime.signals).

    A failure of this function itself (the bus unreachable while answering) reaches the
    consumer, which redelivers the message, and dead-letters it after its last
    delivery: a message always ends, as an answer or in the dead-letter stream."""
    try:
        env = stage.decode(msg)
    except Exception as exc:  # decoding is pure: whatever it raises, the input is bad
        await stage.on_undecodable(deps, msg, exc)
        return Outcome.ERROR
    req = env.request
    # The stage's span names the request, and its route once it has one.
    annotate(request_id=str(req.request_id)[:128], agent_id=str(req.agent_id)[:128],
             **_route(getattr(env, "decision", None)))
    # Every line logged while this message is handled names it (shared.runtime.logs).
    with log_context(request_id=str(req.request_id)[:128], agent_id=str(req.agent_id)[:128]):
        return await _run_decoded(stage, msg, deps, env)


async def _run_decoded(stage: Stage[E, D], msg: Delivery, deps: D, env: E) -> Outcome:
    req = env.request
    if stage.admitted_only:
        problem = id_problem("agent_id", req.agent_id) or id_problem(
            "request_id", req.request_id) or id_problem("session_id", req.session_id)
        if problem:  # no subject can be built from it: nobody to answer
            await report_invalid(deps.bus, msg.subject, ErrorCode.INVALID_FIELD, problem)
            return Outcome.ERROR
        if not deps.admission.admits(env):
            await report_invalid(deps.bus, msg.subject, ErrorCode.NOT_ADMITTED,
                                 f"agent {req.agent_id!r} request {req.request_id!r}: "
                                 "envelope without the gateway's admission")
            return Outcome.ERROR
    if msg.deliveries > 1 and await answered(deps.bus, env):
        # Redelivered after its answer went out (the worker died before acking): done.
        log.warning("[%s] %s already answered; redelivery dropped", stage.name, req.request_id)
        return Outcome.DUPLICATE
    if stage.admitted_only:
        # The gateway's checks, again: what no stage, subject or column can take is
        # answered here rather than failing (and being retried) further on.
        invalid = envelope_problem(env)
        if invalid is not None:
            await answer_error(deps.bus, deps.store, env, invalid.code, invalid.message)
            return Outcome.ERROR
    # Every answer from here on is of this run of the request (its one final chunk).
    token = ANSWER_RUN.set(env.run)
    lease = ANSWER_LEASE.set(
        Lease.start(msg.deliveries, stage.spec.ack_wait, deps.bus.reconnects, msg.stored_at))
    try:
        return await _run_checked(stage, msg, deps, env)
    finally:
        ANSWER_LEASE.reset(lease)
        ANSWER_RUN.reset(token)


async def _run_checked(stage: Stage[E, D], msg: Delivery, deps: D, env: E) -> Outcome:
    req = env.request
    if msg.deliveries > 1 and await AnswerStream(
            deps.bus, req.agent_id, req.request_id).send_claimed():
        # An earlier delivery claimed the answer (AnswerStream.send_claimed): it stands.
        log.warning("[%s] %s: answer claimed by an earlier delivery; not answered again",
                    stage.name, req.request_id)
        return Outcome.DUPLICATE
    if msg.deliveries > 1 and await part_handoffs.hand_on_again(deps.bus, env):
        # A split message's part this message belongs to was answered and handed on
        # (shared.runtime.part_handoffs): the next part is streaming; nothing to redo.
        log.warning("[%s] %s: part handed on already; redelivery dropped", stage.name,
                    req.request_id)
        return Outcome.DUPLICATE
    if env.deadline and time.time() >= env.deadline:
        await answer_error(deps.bus, deps.store, env, ErrorCode.DEADLINE_EXCEEDED,
                           f"the request's deadline passed before {stage.name}")
        return Outcome.ERROR
    call = Call(msg, stage.name, deadline=env.deadline)
    if stage.timed:
        # Time from acceptance to this stage's start: queueing + transit, per stage.
        env.timings[f"{stage.name}.at"] = round((time.time() - env.accepted_at) * 1000, 3)
    try:
        with bounded_by(env.deadline):
            handoff = await stage.logic(env, call, deps)
        if handoff is not None:
            annotate(**_route(getattr(handoff.envelope, "decision", None)))
            if stage.timed:
                call.mark(handoff.envelope, handoff.timing)
            deps.admission.stamp(handoff.envelope)
            # The run in the key: a request id the agent asks with again is a new run,
            # whose handoffs the stream's 120 s duplicate window dropped without it
            # (asked again through the OpenAI door: no answer, a 504 at its timeout).
            # A split message's parts each take the same steps: the part in the key.
            part = getattr(handoff.envelope, "part", 0)
            step = f"p{part}.{handoff.step}" if part else handoff.step
            handed = part_handoffs.PartHandoff(
                handoff.subject, f"{req.agent_id}:{req.request_id}:{env.run}:{step}",
                encode(handoff.envelope))
            if part_handoffs.ends_part(env, handoff.envelope):
                # Claimed before it is published: a redelivery of this part hands on
                # the same next part, never answers this one again.
                assert isinstance(env, Routed)
                handed = await part_handoffs.claim(deps.bus, env, handed)
            await publish_stage(deps.bus, handed.subject, handed.envelope,
                                msg_id=handed.msg_id)
    except Exception as exc:
        if isinstance(exc, IntentrouteError) and not exc.retryable:
            # Answered now: the same request would fail the same way again (the store
            # refusing the turn's rows is one: its port declares it so).
            log.warning("[%s] %s permanent error %s: %s", stage.name, req.request_id,
                        exc.code, exc.message)
            await answer_error(deps.bus, deps.store, env, exc.code, exc.message)
            return Outcome.ERROR
        return await _retry_or_answer(stage, msg, deps, env, exc)
    return Outcome.OK


def _route(decision: RoutingDecision | None) -> dict[str, str]:
    """A routed envelope's query type and deciding layer, as span fields."""
    if decision is None:
        return {}
    return {"query_type": decision.type.value, "layer": decision.layer.value}


def backoff(attempt: int) -> float:
    """Seconds before delivery `attempt + 1`: 0.2, 0.4, 0.8, 1.6, then 2."""
    return float(min(0.2 * 2 ** (attempt - 1), 2.0))


async def _retry_or_answer(
    stage: Stage[E, D], msg: Delivery, deps: D, env: E, exc: Exception
) -> Outcome:
    """A retryable failure (an outage, a timeout) is retried with backoff until the
    request's deadline, and `max_deliver` deliveries at most; then it is answered
    (DEADLINE_EXCEEDED or STAGE_FAILED) and the message dead-lettered for ops."""
    req = env.request
    attempt = msg.deliveries
    remaining = env.deadline - time.time() if env.deadline else float("inf")
    if remaining <= backoff(attempt) or attempt >= stage.spec.max_deliver:
        expired = remaining <= backoff(attempt)
        code = ErrorCode.DEADLINE_EXCEEDED if expired else ErrorCode.STAGE_FAILED
        reason = f"{stage.name} failed on delivery {attempt}: {exc!r}"
        log.error("[%s] %s %s, answering %s", stage.name, req.request_id, reason, code)
        await answer_error(deps.bus, deps.store, env, code, reason)
        await msg.dead_letter(stage.name, reason)
        return Outcome.DEAD_LETTER
    log.warning("[%s] %s retryable error on delivery %d: %r", stage.name, req.request_id,
                attempt, exc)
    await msg.nack(delay=min(backoff(attempt), remaining))
    return Outcome.RETRY


async def answered(bus: Publisher, env: Admitted | Routed) -> bool:
    """Is the final chunk of this run of the request stored already? (An earlier run's,
    of a request id used again, does not count.)"""
    req = env.request
    return await AnswerStream(bus, req.agent_id, req.request_id, run=env.run).final_stored()
