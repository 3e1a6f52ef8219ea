"""NATS ingress: check the request, answer bad input with an error chunk, hand on."""

from __future__ import annotations

import logging
import time

from services.gateway.settings import GatewaySettings
from services.gateway.validation import InputError, parse_request, salvage_field
from shared.bus import AnswerStream
from shared.codec import encode
from shared.contracts import request as request_contract
from shared.contracts.pipeline import CLASSIFY_SUBJECT, Admitted
from shared.contracts.response import UNADDRESSABLE_SUBJECT, ChunkKind, ErrorInfo, ResponseChunk
from shared.stage import Call, Handoff, Stage, StageDeps, stage_spec
from shared.store.rows import RequestLogRow

log = logging.getLogger("intentroute.gateway")


def admit(raw: bytes) -> Admitted:
    """The gateway's decoder: a checked request, or `InvalidRequestError` with the error."""
    parsed = parse_request(raw)
    if isinstance(parsed, InputError):
        raise InvalidRequestError(parsed)
    return Admitted(request=parsed, accepted_at=time.time())


class InvalidRequestError(ValueError):
    def __init__(self, error: InputError) -> None:
        super().__init__(error.message)
        self.error = error


async def reject_input(deps: StageDeps, raw: bytes, exc: Exception) -> None:
    """Bad input ends as a final error chunk, never as a silent drop."""
    error = exc.error if isinstance(exc, InvalidRequestError) else InputError(
        "MALFORMED_JSON", f"request does not decode: {exc}")
    log.warning("[gateway] rejected request %r: %s %s", error.request_id, error.code,
                error.message)
    if error.request_id:
        await AnswerStream(deps.bus, error.request_id).error(error.code, error.message)
        await deps.store.write(
            RequestLogRow(
                request_id=error.request_id,
                agent_id=salvage_field(raw, "agent_id"),
                session_id=salvage_field(raw, "session_id"),
                outcome=f"error:{error.code}",
            )
        )
        return
    # No request_id to address: answer on the dead-letter subject with an excerpt.
    chunk = ResponseChunk(
        request_id="",
        seq=0,
        kind=ChunkKind.FINAL,
        is_final=True,
        text=raw[:512].decode("utf-8", errors="replace"),
        error=ErrorInfo(error.code, error.message),
    )
    await deps.bus.publish(UNADDRESSABLE_SUBJECT, encode(chunk))


async def on_request(env: Admitted, call: Call, deps: StageDeps) -> Handoff:
    return Handoff(CLASSIFY_SUBJECT, env, "accepted")


def build_stage(settings: GatewaySettings) -> Stage[Admitted, StageDeps]:
    return Stage(
        name="gateway",
        spec=stage_spec(
            settings.common,
            stream=request_contract.STREAM,
            subject=request_contract.SUBJECT,
            durable="gateway",
            max_inflight=settings.batch_size,
        ),
        decode=admit,
        logic=on_request,
        on_undecodable=reject_input,
        timed=False,
    )
