"""How a request ends: the rows of a finished turn, error answers, and reports of what
cannot be answered. Every request ends in exactly one final chunk; an envelope with no
caller to answer is reported for ops on the internal invalid subject."""

from __future__ import annotations

import logging
import time
from typing import Any

from shared.contracts import response
from shared.contracts.codec import encode
from shared.contracts.pipeline import Admitted, Routed
from shared.contracts.response import (
    INTERNAL_INVALID_SUBJECT,
    ChunkKind,
    ErrorCode,
    ErrorInfo,
    ResponseChunk,
    TokenUsage,
    response_subject,
)
from shared.contracts.routing import RoutingDecision, topic_snippet
from shared.runtime.answer_stream import AnswerStream
from shared.runtime.ports import Publisher
from shared.store.ports import StoreError, TurnStore
from shared.store.rows import HistoryRow, RequestLogRow, Row, TurnRow, storable

log = logging.getLogger("intentroute.stage")

# After an error answer its rows are still written for this long if the store is down
# (the answer is already out: waiting costs the caller nothing).
ERROR_ROWS_GRACE = 30.0


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


def _accounting(env: Admitted | Routed) -> dict[str, Any]:
    """The request log's accounting columns from the envelope's `usage` (nothing when
    accounting is off or nothing was generated), cut to their columns' widths."""
    usage = env.usage if isinstance(env, Routed) else None
    if usage is None:
        return {}
    return {"model": usage.model[:128], "tokens_in": usage.tokens_in,
            "tokens_out": usage.tokens_out, "tokens_note": usage.tokens_note[:64],
            "compute_ms": round(usage.compute_ms, 3), "fallback": usage.fallback,
            "fallback_reason": usage.fallback_reason[:64],
            "model_parts": [(p.model[:128], p.tokens_in, p.tokens_out) for p in usage.parts]}


def answer_usage(env: Routed) -> TokenUsage | None:
    """The final chunk's `usage`: the tokens the request log counts for this answer
    (None with accounting off)."""
    usage = env.usage
    if usage is None:
        return None
    return TokenUsage(tokens_in=usage.tokens_in, tokens_out=usage.tokens_out)


def request_log_row(env: Admitted | Routed, outcome: str, **fields: Any) -> RequestLogRow:
    """The request-log row of `env`: ids, routing decision and stage timings, the
    generation's accounting (`env.usage`), plus whatever the finishing stage knows
    (`answered_by`, `validation_status`, `first_chunk_ms`, ...)."""
    req = env.request
    dec = decision_of(env)
    if "answered_by" in fields:
        fields["answered_by"] = fields["answered_by"][:64]
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
        **_accounting(env),
        created_at=env.accepted_at,
        **fields,
    )


async def answer_error(
    bus: Publisher,
    store: TurnStore,
    env: Admitted | Routed,
    code: str,
    message: str,
) -> None:
    """Final error chunk to the caller, then the turn's history and request-log rows.

    The answer goes out once, whatever happens to the rows: they are written for a
    grace period if the store is down, and a row the database refuses is logged. It
    follows whatever is stored on the response subject already, and is not sent when
    this run's final chunk is."""
    req = env.request
    start_seq = env.seq if isinstance(env, Routed) else 0
    # A stage may fail after streaming part of its answer (or a previous delivery may
    # have): the error goes after what is stored, and a reset drops the partial text.
    last = await bus.last_chunk(response_subject(req.agent_id, req.request_id),
                                response.STREAM)
    stream = AnswerStream(bus, req.agent_id, req.request_id,
                          start_seq=max(start_seq, last.seq + 1) if last else start_seq)
    # This run's final (an earlier run's, of a request id used again, does not count),
    # wherever on the subject: another delivery's chunks may follow it.
    if last is not None and await stream.final_stored():
        log.warning("[%s] already answered; %s not sent", req.request_id, code)
        return
    if last is not None and last.seq >= start_seq:
        await stream.reset()
    await stream.error(code, message, decision=decision_of(env))
    rows: list[Row] = [request_log_row(env, f"error:{code}")]
    if isinstance(env, Routed):
        rows.append(history_row(env))
    await write_after_answer(store, rows, req.request_id)


async def write_after_answer(store: TurnStore, rows: list[Row], request_id: str) -> None:
    try:
        await store.write(*(storable(r) for r in rows),
                          deadline=time.time() + ERROR_ROWS_GRACE)
    except StoreError as exc:
        # The caller has its answer; a store that keeps failing must not turn it into a
        # loop or a second answer.
        log.error("[%s] rows of an error answer not stored: %s", request_id, exc)


async def finish_turn(
    store: TurnStore,
    env: Routed,
    *,
    answer: str,
    answered_by: str,
    validation_status: str = "",
    retried: bool = False,
    first_chunk_at: float | None = None,
) -> None:
    """Store the turn, its classify_history entry and its request-log row in one
    write before the final chunk goes out, so the next turn of the session already
    sees this answer and this turn's type. The stages' store does not wait on an absent
    Postgres: past a moment the rows are queued on the bus and written when it is back,
    and the session's next reads wait for them (shared.runtime.row_queue).

    With accounting on (`env.usage` set) the row has the time to the first chunk:
    from the gateway's acceptance to `first_chunk_at` (epoch seconds: when the first
    piece of the answer's text went out), or to now for an answer that goes out in
    one piece with the final chunk, right after this write."""
    req, dec = env.request, env.decision
    first_chunk: dict[str, float] = {}
    if env.usage is not None:
        sent = first_chunk_at if first_chunk_at is not None else time.time()
        first_chunk["first_chunk_ms"] = round((sent - env.accepted_at) * 1000, 3)
    await store.write(
        history_row(env),
        TurnRow(
            agent_id=req.agent_id,
            session_id=req.session_id,
            request_id=req.request_id,
            query=req.query,
            # Model output and retrieved text may hold NUL characters, which Postgres
            # text cannot (the query cannot: the gateway refuses them).
            answer=answer.replace("\x00", ""),
            query_type=dec.type.value,
        ),
        request_log_row(
            env,
            "ok",
            answered_by=answered_by,
            total_ms=round((time.time() - env.accepted_at) * 1000, 3),
            validation_status=validation_status,
            retried=retried or env.retrieval_retried,
            **first_chunk,
        ),
        deadline=env.deadline or None,
    )


async def report_invalid(bus: Publisher, subject: str, code: ErrorCode, message: str) -> None:
    """A message with no caller to answer (it does not decode, its ids are unusable, it
    lacks the gateway's admission): reported for ops on the internal invalid subject."""
    log.error("%s on %s reported on %s: %s", code, subject, INTERNAL_INVALID_SUBJECT, message)
    chunk = ResponseChunk(request_id="", seq=0, kind=ChunkKind.FINAL, is_final=True,
                          error=ErrorInfo(code, f"{subject}: {message}"))
    await bus.publish(INTERNAL_INVALID_SUBJECT, encode(chunk))
