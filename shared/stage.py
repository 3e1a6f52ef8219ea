"""The one shape every stage has: decode, guard redeliveries, time, call the logic, hand off.

A stage is its delivery settings (`StageSpec`), a decoder for its envelope and a logic
function. `run_stage` does the rest, the same way for every stage:

* an envelope that does not decode is reported (the stage's `on_undecodable`) and
  acknowledged, never retried;
* `<stage>.at` records when the stage started (ms after the gateway accepted it);
* the logic returns a `Handoff` (the next subject and envelope) or None when it answered
  the caller itself; a hand-off records the stage's time and is published durably with a
  msg id that makes a re-publish after a crash a no-op;
* errors are either permanent (`PermanentError`: the caller gets a final error chunk and
  the message is acknowledged) or retryable (anything else: nack with backoff so another
  delivery, possibly on another replica, tries again). On the last allowed delivery a
  retryable error becomes an error answer too, so a poison message ends as a reply,
  never as a loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from opentelemetry.trace import Tracer

from shared.admission import Admission
from shared.bus import AnswerStream, publish_stage
from shared.codec import encode
from shared.consumer import Handler, StageSpec
from shared.contracts.pipeline import Admitted, Routed
from shared.contracts.request import AgentRequest
from shared.contracts.response import (
    INTERNAL_INVALID_SUBJECT,
    ChunkKind,
    ErrorCode,
    ErrorInfo,
    ResponseChunk,
)
from shared.contracts.routing import RoutingDecision, topic_snippet
from shared.ports import Delivery, Publisher, TurnStore
from shared.settings import CommonSettings
from shared.store.rows import HistoryRow, RequestLogRow, Row, TurnRow
from shared.store.stores import StoreUnavailableError

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


class PermanentError(Exception):
    """A request that cannot succeed however often it is retried."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


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
    started: float = field(default_factory=time.perf_counter)

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
    """An envelope no stage can read has no caller to answer: it is reported on the
    internal invalid subject and acknowledged."""
    log.error("undecodable envelope on %s reported on %s: %s", msg.subject,
              INTERNAL_INVALID_SUBJECT, exc)
    chunk = ResponseChunk(
        request_id="",
        seq=0,
        kind=ChunkKind.FINAL,
        is_final=True,
        error=ErrorInfo(ErrorCode.BAD_ENVELOPE, f"envelope does not decode: {exc}"),
    )
    await deps.bus.publish(INTERNAL_INVALID_SUBJECT, encode(chunk))


async def report_not_admitted(deps: StageDeps, msg: Delivery, env: Admitted | Routed) -> None:
    """An envelope that did not come through the gateway: nobody is answered (its
    claimed agent may not have sent it), it is reported and acknowledged."""
    req = env.request
    log.error("envelope on %s without the gateway's admission (agent %r, request %r) "
              "reported on %s", msg.subject, req.agent_id, req.request_id,
              INTERNAL_INVALID_SUBJECT)
    chunk = ResponseChunk(
        request_id="", seq=0, kind=ChunkKind.FINAL, is_final=True,
        error=ErrorInfo(ErrorCode.NOT_ADMITTED,
                        f"{msg.subject}: envelope without the gateway's admission"),
    )
    await deps.bus.publish(INTERNAL_INVALID_SUBJECT, encode(chunk))


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

    async def handle(self, msg: Delivery, deps: D) -> None:
        await run_stage(self, msg, deps)

    def bind(self, deps: D) -> Handler:
        async def handler(msg: Delivery) -> None:
            await run_stage(self, msg, deps)

        return handler


def stage_spec(
    common: CommonSettings, *, stream: str, subject: str, durable: str, max_inflight: int
) -> StageSpec:
    """A stage's delivery settings: its own stream, subject, durable and batch, plus the
    redelivery bounds (`ack_wait`, `max_deliver`) every stage takes from CommonSettings."""
    return StageSpec(stream=stream, subject=subject, durable=durable, max_inflight=max_inflight,
                     ack_wait=common.ack_wait, max_deliver=common.max_deliver)


async def run_stage(stage: Stage[E, D], msg: Delivery, deps: D) -> None:
    try:
        env = stage.decode(msg)
    except Exception as exc:  # decoding is pure: whatever it raises, the input is bad
        await stage.on_undecodable(deps, msg, exc)
        return
    if stage.admitted_only and not deps.admission.admits(env):
        await report_not_admitted(deps, msg, env)
        return
    call = Call(msg, stage.name)
    if stage.timed:
        # Time from acceptance to this stage's start: queueing + transit, per stage.
        env.timings[f"{stage.name}.at"] = round((time.time() - env.accepted_at) * 1000, 3)
    try:
        handoff = await stage.logic(env, call, deps)
        if handoff is not None:
            if stage.timed:
                call.mark(handoff.envelope, handoff.timing)
            deps.admission.stamp(handoff.envelope)
            await publish_stage(
                deps.bus, handoff.subject, encode(handoff.envelope),
                msg_id=f"{env.request.agent_id}:{env.request.request_id}:{handoff.step}",
            )
    except PermanentError as exc:
        log.warning("[%s] %s permanent error %s: %s", stage.name, env.request.request_id,
                    exc.code, exc.message)
        await answer_error(deps.bus, deps.store, env, exc.code, exc.message)
    except Exception as exc:
        attempt = msg.deliveries
        if attempt >= stage.spec.max_deliver:
            log.error("[%s] %s failed on delivery %d/%d, answering with an error: %r",
                      stage.name, env.request.request_id, attempt, stage.spec.max_deliver, exc)
            await answer_error(
                deps.bus, deps.store, env, ErrorCode.STAGE_FAILED,
                f"{stage.name} failed after {attempt} attempts: {exc}",
            )
            return
        log.warning("[%s] %s retryable error on delivery %d: %r",
                    stage.name, env.request.request_id, attempt, exc)
        await msg.nack(delay=min(0.2 * attempt, 2.0))


def decision_of(env: Admitted | Routed) -> RoutingDecision | None:
    return env.decision if isinstance(env, Routed) else None


def history_row(env: Routed) -> HistoryRow:
    """The turn's classify_history entry: type plus a <=60-character topic (RC-06)."""
    req, dec = env.request, env.decision
    return HistoryRow(
        agent_id=req.agent_id,
        session_id=req.session_id,
        request_id=req.request_id,
        type=dec.type.value,
        topic=topic_snippet(req.query),
        layer=dec.layer.value,
        confidence=dec.confidence,
    )


def request_log_row(env: Admitted | Routed, outcome: str, **fields: Any) -> RequestLogRow:
    """The request-log row of `env`: ids, routing decision and stage timings, plus
    whatever the finishing stage knows (`answered_by`, `validation_status`, ...)."""
    req = env.request
    dec = decision_of(env)
    return RequestLogRow(
        request_id=req.request_id,
        agent_id=req.agent_id,
        session_id=req.session_id,
        outcome=outcome,
        query_type=dec.type.value if dec else "",
        layer=dec.layer.value if dec else "",
        confidence=dec.confidence if dec else None,
        model_slot=dec.model_slot.value if dec else "",
        stage_ms=env.timings,
        **fields,
    )


async def answer_error(
    bus: Publisher,
    store: TurnStore,
    env: Admitted | Routed,
    code: str,
    message: str,
) -> None:
    """Final error chunk to the caller plus the turn's history and request-log rows."""
    req = env.request
    start_seq = env.seq if isinstance(env, Routed) else 0
    await AnswerStream(bus, req.agent_id, req.request_id, start_seq=start_seq).error(
        code, message, decision=decision_of(env)
    )
    rows: list[Row] = [request_log_row(env, f"error:{code}")]
    if isinstance(env, Routed):
        rows.append(history_row(env))
    try:
        await store.write(*rows)
    except StoreUnavailableError as exc:
        # The caller has its answer; a store that keeps failing must not turn it into a loop.
        log.error("[%s] error rows not stored: %s", req.request_id, exc)


async def finish_turn(
    store: TurnStore,
    env: Routed,
    *,
    answer: str,
    answered_by: str,
    validation_status: str = "",
    retried: bool = False,
) -> None:
    """Store the turn, its classify_history entry and its request-log row in one
    write before the final chunk goes out, so the next turn of the session already
    sees this answer and this turn's type."""
    req, dec = env.request, env.decision
    await store.write(
        history_row(env),
        TurnRow(
            agent_id=req.agent_id,
            session_id=req.session_id,
            request_id=req.request_id,
            query=req.query,
            answer=answer,
            query_type=dec.type.value,
        ),
        request_log_row(
            env,
            "ok",
            answered_by=answered_by,
            total_ms=round((time.time() - env.accepted_at) * 1000, 3),
            validation_status=validation_status,
            retried=retried or env.retrieval_retried,
        ),
    )
