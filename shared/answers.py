"""How a request ends: the rows of a finished turn, error answers, and reports of what
cannot be answered. Every request ends in exactly one final chunk; an envelope with no
caller to answer is reported for ops on the internal invalid subject."""

from __future__ import annotations

import logging
import time
from typing import Any

from shared.bus import AnswerStream
from shared.codec import encode
from shared.contracts.pipeline import Admitted, Routed
from shared.contracts.response import (
    INTERNAL_INVALID_SUBJECT,
    ChunkKind,
    ErrorCode,
    ErrorInfo,
    ResponseChunk,
)
from shared.contracts.routing import RoutingDecision, topic_snippet
from shared.ports import Publisher, TurnStore
from shared.store.rows import HistoryRow, RequestLogRow, Row, TurnRow, storable
from shared.store.writer import StoreError

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
    """Final error chunk to the caller, then the turn's history and request-log rows.

    The answer goes out once, whatever happens to the rows: they are written for a
    grace period if the store is down, and a row the database refuses is logged."""
    req = env.request
    start_seq = env.seq if isinstance(env, Routed) else 0
    await AnswerStream(bus, req.agent_id, req.request_id, start_seq=start_seq).error(
        code, message, decision=decision_of(env)
    )
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
) -> None:
    """Store the turn, its classify_history entry and its request-log row in one
    write before the final chunk goes out, so the next turn of the session already
    sees this answer and this turn's type. An unreachable store is retried until the
    request's deadline."""
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
        deadline=env.deadline or None,
    )


async def report_invalid(bus: Publisher, subject: str, code: ErrorCode, message: str) -> None:
    """A message with no caller to answer (it does not decode, its ids are unusable, it
    lacks the gateway's admission): reported for ops on the internal invalid subject."""
    log.error("%s on %s reported on %s: %s", code, subject, INTERNAL_INVALID_SUBJECT, message)
    chunk = ResponseChunk(request_id="", seq=0, kind=ChunkKind.FINAL, is_final=True,
                          error=ErrorInfo(code, f"{subject}: {message}"))
    await bus.publish(INTERNAL_INVALID_SUBJECT, encode(chunk))
