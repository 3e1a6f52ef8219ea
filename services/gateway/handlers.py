"""NATS ingress: check the request, answer bad input with an error chunk, hand on."""

from __future__ import annotations

import logging
import time

from faststream import Context
from faststream.middlewares import AckPolicy
from faststream.nats import NatsBroker, NatsMessage, NatsRouter, PullSub

from services.gateway.settings import GatewaySettings
from services.gateway.validation import InputError, parse_request, salvage_field
from shared.bus import REQUESTS_STREAM, AnswerStream, consumer_config, publish_stage, raw_body
from shared.codec import encode
from shared.contracts import request as request_contract
from shared.contracts.pipeline import CLASSIFY_SUBJECT, Envelope
from shared.contracts.response import UNADDRESSABLE_SUBJECT, ChunkKind, ErrorInfo, ResponseChunk
from shared.store.stores import RequestLogRow, Store

log = logging.getLogger("intentroute.gateway")


class GatewayDeps:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def close(self) -> None:
        await self.store.close()


async def reject_input(broker: NatsBroker, store: Store, error: InputError, raw: bytes) -> None:
    """Bad input ends as a final error chunk, never as a silent drop."""
    log.warning("[gateway] rejected request %r: %s %s", error.request_id, error.code,
                error.message)
    if error.request_id:
        await AnswerStream(broker, error.request_id).error(error.code, error.message)
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
    await broker.publish(encode(chunk), UNADDRESSABLE_SUBJECT)


def build_router(settings: GatewaySettings) -> NatsRouter:
    router = NatsRouter()

    @router.subscriber(
        request_contract.SUBJECT,
        stream=REQUESTS_STREAM,
        durable="gateway",
        pull_sub=PullSub(batch_size=settings.batch_size, timeout=5.0),
        config=consumer_config(settings.common),
        ack_policy=AckPolicy.NACK_ON_ERROR,
        decoder=raw_body,
    )
    async def on_request(
        msg: NatsMessage,
        deps: GatewayDeps = Context("deps"),
        broker: NatsBroker = Context("broker"),
    ) -> None:
        parsed = parse_request(msg.body)
        if isinstance(parsed, InputError):
            await reject_input(broker, deps.store, parsed, msg.body)
            return
        env = Envelope(request=parsed, accepted_at=time.time())
        await publish_stage(
            broker, CLASSIFY_SUBJECT, encode(env), msg_id=f"{parsed.request_id}:accepted"
        )

    return router
