"""What every stage does around its handler: decode once, sort errors, never loop.

Errors are either permanent (`PermanentError`: the request can never succeed; the
caller gets a final error chunk and the message is acknowledged) or retryable
(anything else: nack with backoff so another delivery, possibly on another
replica, tries again). On the last allowed delivery a retryable error becomes an
error answer too, so a poison message ends as a reply, never as a loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec

from shared.bus import AnswerStream, Bus
from shared.codec import decode_envelope, encode
from shared.consumer import Delivery, StageSpec
from shared.contracts.pipeline import Envelope
from shared.contracts.response import UNADDRESSABLE_SUBJECT, ChunkKind, ErrorInfo, ResponseChunk
from shared.contracts.routing import topic_snippet
from shared.settings import CommonSettings
from shared.store.stores import (
    HistoryRow,
    RequestLogRow,
    Row,
    Store,
    StoreUnavailable,
    TurnRow,
)

log = logging.getLogger("intentroute.stage")


def stage_spec(
    common: CommonSettings, *, stream: str, subject: str, durable: str, max_inflight: int
) -> StageSpec:
    """A stage's delivery settings: its own stream, subject, durable and batch, plus the
    redelivery bounds (`ack_wait`, `max_deliver`) every stage takes from CommonSettings."""
    return StageSpec(stream=stream, subject=subject, durable=durable, max_inflight=max_inflight,
                     ack_wait=common.ack_wait, max_deliver=common.max_deliver)


class PermanentError(Exception):
    """A request that cannot succeed however often it is retried."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


async def decode_or_report(bus: Bus, msg: Delivery, stage: str) -> Envelope | None:
    """Decode the envelope; an undecodable one is reported and acknowledged."""
    try:
        return decode_envelope(msg.data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.error("[%s] undecodable envelope dropped to %s: %s", stage, UNADDRESSABLE_SUBJECT, exc)
        chunk = ResponseChunk(
            request_id="",
            seq=0,
            kind=ChunkKind.FINAL,
            is_final=True,
            error=ErrorInfo("BAD_ENVELOPE", f"{stage}: envelope does not decode: {exc}"),
        )
        await bus.publish(UNADDRESSABLE_SUBJECT, encode(chunk))
        return None


def history_row(env: Envelope) -> HistoryRow:
    """The turn's classify_history entry: type plus a <=60-character topic (RC-06)."""
    req = env.request
    dec = env.decision
    assert dec is not None
    return HistoryRow(
        agent_id=req.agent_id,
        session_id=req.session_id,
        request_id=req.request_id,
        type=dec.type.value,
        topic=topic_snippet(req.query),
        layer=dec.layer.value,
        confidence=dec.confidence,
    )


def request_log_row(env: Envelope, outcome: str, **fields: Any) -> RequestLogRow:
    """The request-log row of `env`: ids, routing decision and stage timings, plus
    whatever the finishing stage knows (`answered_by`, `validation_status`, ...)."""
    req = env.request
    dec = env.decision
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
    bus: Bus,
    store: Store | None,
    env: Envelope,
    code: str,
    message: str,
    *,
    start_seq: int = 0,
) -> None:
    """Final error chunk to the caller plus the turn's history and request-log rows."""
    req = env.request
    await AnswerStream(bus, req.request_id, start_seq=start_seq).error(
        code, message, decision=env.decision
    )
    if store is None:
        return
    rows: list[Row] = [request_log_row(env, f"error:{code}")]
    if env.decision is not None:
        rows.append(history_row(env))
    try:
        await store.write(*rows)
    except StoreUnavailable as exc:
        # The caller has its answer; a store that keeps failing must not turn it into a loop.
        log.error("[%s] error rows not stored: %s", req.request_id, exc)


@asynccontextmanager
async def stage_guard(
    bus: Bus,
    msg: Delivery,
    env: Envelope,
    *,
    stage: str,
    max_deliver: int,
    store: Store | None,
) -> AsyncIterator[None]:
    # Time from acceptance to this stage's start: queueing + transit, per stage.
    env.timings[f"{stage}.at"] = round((time.time() - env.accepted_at) * 1000, 3)
    try:
        yield
    except PermanentError as exc:
        log.warning("[%s] %s permanent error %s: %s", stage, env.request.request_id,
                    exc.code, exc.message)
        await answer_error(bus, store, env, exc.code, exc.message)
    except Exception as exc:
        attempt = msg.deliveries
        if attempt >= max_deliver:
            log.error("[%s] %s failed on delivery %d/%d, answering with an error: %r",
                      stage, env.request.request_id, attempt, max_deliver, exc)
            await answer_error(
                bus, store, env, "STAGE_FAILED",
                f"{stage} failed after {attempt} attempts: {exc}",
            )
            return
        log.warning("[%s] %s retryable error on delivery %d: %r",
                    stage, env.request.request_id, attempt, exc)
        await msg.nack(delay=min(0.2 * attempt, 2.0))


async def finish_turn(
    store: Store,
    env: Envelope,
    *,
    answer: str,
    answered_by: str,
    validation_status: str = "",
    retried: bool = False,
) -> None:
    """Store the turn, its classify_history entry and its request-log row in one
    write before the final chunk goes out, so the next turn of the session already
    sees this answer and this turn's type."""
    req = env.request
    dec = env.decision
    assert dec is not None
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
