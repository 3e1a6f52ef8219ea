"""Bus wiring shared by every worker: broker factory, stream definitions, answer streaming.

Streams:
- AGENT_REQUESTS (`agent.request`), work-queue retention: the gateway's durable
  pull consumer shares requests among gateway replicas.
- INTENTROUTE_PIPELINE (`intentroute.stage.>`), work-queue retention: one durable
  pull consumer per stage (and per model slot for the generator).
- AGENT_RESPONSES (`agent.response.>`), limits retention with a TTL: every chunk is
  stored, so a subscriber that joins late still reads the whole answer.
"""

from __future__ import annotations

import logging

from faststream.nats import JStream, NatsBroker, NatsMessage
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError
from opentelemetry.trace import TracerProvider

from shared.codec import encode
from shared.contracts import pipeline, request, response
from shared.contracts.response import ChunkKind, ErrorInfo, ResponseChunk, response_subject
from shared.contracts.routing import RoutingDecision
from shared.settings import CommonSettings

log = logging.getLogger("intentroute.bus")

# Streams are declared once by `ensure_streams` (not by FastStream from subscriber
# subjects, which would add overlapping subjects to the pipeline stream).
REQUESTS_STREAM = JStream(name=request.STREAM, declare=False)
PIPELINE_STREAM = JStream(name=pipeline.STREAM, declare=False)


def stream_configs(response_ttl: float) -> list[StreamConfig]:
    return [
        StreamConfig(
            name=request.STREAM,
            subjects=[request.SUBJECT],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            max_age=24 * 3600,
            duplicate_window=120,
        ),
        StreamConfig(
            name=pipeline.STREAM,
            subjects=[f"{pipeline.SUBJECT_PREFIX}.>"],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            max_age=24 * 3600,
            duplicate_window=120,
        ),
        StreamConfig(
            name=response.STREAM,
            subjects=[f"{response.SUBJECT_PREFIX}.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=response_ttl,
            duplicate_window=120,
        ),
    ]


async def ensure_streams(js: JetStreamContext, response_ttl: float) -> None:
    """Create or update the three streams; every worker may call it at start."""
    for cfg in stream_configs(response_ttl):
        try:
            await js.add_stream(config=cfg)
        except BadRequestError:
            await js.update_stream(config=cfg)


async def connect_and_declare(broker: NatsBroker, settings: CommonSettings) -> None:
    """Connect the broker and declare streams before its subscribers start."""
    await broker.connect()
    await ensure_streams(broker.config.connection_state.stream, settings.response_ttl)


def make_broker(
    settings: CommonSettings, *, tracer_provider: TracerProvider | None = None
) -> NatsBroker:
    middlewares = []
    if tracer_provider is not None:
        from faststream.nats.opentelemetry import NatsTelemetryMiddleware

        middlewares.append(NatsTelemetryMiddleware(tracer_provider=tracer_provider))
    # FastStream logs two lines per message at INFO; that costs more than a hop.
    quiet = logging.getLogger("intentroute.faststream")
    quiet.setLevel(logging.WARNING)
    return NatsBroker(
        settings.nats_url,
        middlewares=middlewares,
        logger=quiet,
        graceful_timeout=10.0,
        max_reconnect_attempts=-1,
    )


async def raw_body(msg: NatsMessage) -> bytes:
    """Subscriber decoder that leaves the body as bytes: handlers decode it once, with
    the contract's typed msgspec decoder, instead of FastStream parsing the JSON too."""
    return msg.body


def consumer_config(settings: CommonSettings) -> ConsumerConfig:
    """Redelivery settings: a dead worker's message goes to a replica after ack_wait."""
    return ConsumerConfig(ack_wait=settings.ack_wait, max_deliver=settings.max_deliver)


def deliveries(msg: NatsMessage) -> int:
    """How many times JetStream has delivered this message (1 on the first try)."""
    meta = getattr(msg.raw_message, "metadata", None)
    return int(meta.num_delivered) if meta is not None else 1


async def publish_stage(
    broker: NatsBroker, subject: str, payload: bytes, *, msg_id: str
) -> None:
    """Durable hand-off to the next stage; the msg id makes a re-publish after a crash a no-op."""
    await broker.publish(
        payload,
        subject,
        stream=pipeline.STREAM,
        headers={"Nats-Msg-Id": msg_id},
    )


class AnswerStream:
    """Publishes the ordered chunks of one answer on `agent.response.<request_id>`.

    Text chunks go out as core publishes on one connection (ordered, stored by the
    AGENT_RESPONSES stream); the final chunk is a JetStream publish whose ack
    confirms the whole answer is stored, and whose msg id keeps it unique.
    """

    def __init__(self, broker: NatsBroker, request_id: str, *, start_seq: int = 0) -> None:
        self._broker = broker
        self.request_id = request_id
        self.subject = response_subject(request_id)
        self.seq = start_seq
        self.text_parts: list[str] = []

    async def _send(self, chunk: ResponseChunk) -> None:
        await self._broker.publish(encode(chunk), self.subject)
        self.seq += 1

    async def text(self, text: str) -> None:
        if text:
            self.text_parts.append(text)
            await self._send(ResponseChunk(request_id=self.request_id, seq=self.seq, text=text))

    async def status(self, text: str) -> None:
        await self._send(
            ResponseChunk(
                request_id=self.request_id, seq=self.seq, text=text, kind=ChunkKind.STATUS
            )
        )

    async def reset(self) -> None:
        self.text_parts.clear()
        await self._send(
            ResponseChunk(request_id=self.request_id, seq=self.seq, kind=ChunkKind.RESET)
        )

    async def final(
        self,
        *,
        decision: RoutingDecision | None,
        text: str = "",
        kind: ChunkKind = ChunkKind.FINAL,
        validation_status: str = "",
        avap_code: str = "",
        answered_by: str = "",
        retried: bool = False,
        error: ErrorInfo | None = None,
    ) -> None:
        chunk = ResponseChunk(
            request_id=self.request_id,
            seq=self.seq,
            text=text,
            kind=kind,
            is_final=True,
            query_type=decision.type.value if decision else "",
            validation_status=validation_status,
            error=error,
            decision=decision,
            avap_code=avap_code,
            answered_by=answered_by,
            retried=retried,
        )
        await self._broker.publish(
            encode(chunk),
            self.subject,
            stream=response.STREAM,
            headers={"Nats-Msg-Id": f"{self.request_id}:final"},
        )
        self.seq += 1

    async def error(
        self, code: str, message: str, *, decision: RoutingDecision | None = None
    ) -> None:
        await self.final(decision=decision, error=ErrorInfo(code=code, message=message))

    @property
    def answer(self) -> str:
        return "".join(self.text_parts)


async def last_seq(broker: NatsBroker, request_id: str) -> int:
    """Next free seq on a response subject (used when a redelivered stage resumes)."""
    from nats.js.errors import NotFoundError

    js = broker.config.connection_state.stream
    try:
        msg = await js.get_last_msg(response.STREAM, response_subject(request_id))
    except NotFoundError:
        return 0
    from shared.codec import decode_chunk

    return decode_chunk(msg.data).seq + 1
