"""NATS ingress: check the request, answer bad input with an error chunk, hand on."""

from __future__ import annotations

import logging
import time

from services.gateway.settings import GatewaySettings
from services.gateway.validation import InputError, parse_request, salvage_field
from shared.bus import AnswerStream, Bus, publish_stage
from shared.codec import encode
from shared.consumer import Delivery, Stage
from shared.contracts import request as request_contract
from shared.contracts.pipeline import CLASSIFY_SUBJECT, Envelope
from shared.contracts.response import UNADDRESSABLE_SUBJECT, ChunkKind, ErrorInfo, ResponseChunk
from shared.stage import stage_spec
from shared.store.stores import RequestLogRow, Store

log = logging.getLogger("intentroute.gateway")


class GatewayDeps:
    def __init__(self, bus: Bus, store: Store) -> None:
        self.bus = bus
        self.store = store

    async def close(self) -> None:
        await self.store.close()


async def reject_input(bus: Bus, store: Store, error: InputError, raw: bytes) -> None:
    """Bad input ends as a final error chunk, never as a silent drop."""
    log.warning("[gateway] rejected request %r: %s %s", error.request_id, error.code,
                error.message)
    if error.request_id:
        await AnswerStream(bus, error.request_id).error(error.code, error.message)
        await store.write(
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
    await bus.publish(UNADDRESSABLE_SUBJECT, encode(chunk))


async def on_request(msg: Delivery, deps: GatewayDeps) -> None:
    parsed = parse_request(msg.data)
    if isinstance(parsed, InputError):
        await reject_input(deps.bus, deps.store, parsed, msg.data)
        return
    env = Envelope(request=parsed, accepted_at=time.time())
    await publish_stage(
        deps.bus, CLASSIFY_SUBJECT, encode(env), msg_id=f"{parsed.request_id}:accepted"
    )


def build_stage(settings: GatewaySettings) -> Stage[GatewayDeps]:
    return Stage(
        stage_spec(
            settings.common,
            stream=request_contract.STREAM,
            subject=request_contract.SUBJECT,
            durable="gateway",
            max_inflight=settings.batch_size,
        ),
        on_request,
    )
