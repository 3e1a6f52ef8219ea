"""Bus wiring shared by every worker: broker factory, stream definitions, answer streaming.

Streams:
- AGENT_REQUESTS (`agent.request.*`), work-queue retention: the gateway's durable
  pull consumer shares requests among gateway replicas.
- INTENTROUTE_PIPELINE (`intentroute.stage.>`), work-queue retention: one durable
  pull consumer per stage (and per model slot for the generator).
- AGENT_RESPONSES (`agent.response.>`), limits retention with a TTL: every chunk is
  stored, so a subscriber that joins late still reads the whole answer.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any

from faststream.nats import NatsBroker
from faststream.nats.security import NatsCredentials, NatsSecurity, NatsToken, NatsUserPassword
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError, NotFoundError
from opentelemetry import propagate

from shared.codec import decode_chunk, encode
from shared.contracts import deadletter, pipeline, request, response
from shared.contracts.response import ChunkKind, ErrorInfo, ResponseChunk, response_subject
from shared.contracts.routing import RoutingDecision
from shared.natsconn import connect_kwargs
from shared.ports import Publisher
from shared.settings import CommonSettings

log = logging.getLogger("intentroute.bus")

# Set while a stage handles a redelivered message: its final chunk is sent only if no
# other delivery's is stored (checked at the last moment, the race being a delivery
# that lost its connection mid-answer and the server's redelivery of it).
REDELIVERED: ContextVar[bool] = ContextVar("intentroute_redelivered", default=False)


def stream_configs(response_ttl: float) -> list[StreamConfig]:
    return [
        StreamConfig(
            name=request.STREAM,
            subjects=[request.SUBJECTS],
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
        # Messages that exhausted their deliveries, kept a week for an operator.
        StreamConfig(
            name=deadletter.STREAM,
            subjects=[f"{deadletter.SUBJECT_PREFIX}.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=7 * 24 * 3600,
        ),
    ]


async def ensure_streams(js: JetStreamContext, response_ttl: float) -> None:
    """Create or update the three streams; every worker may call it at start."""
    for cfg in stream_configs(response_ttl):
        try:
            await js.add_stream(config=cfg)
        except BadRequestError:
            await js.update_stream(config=cfg)


class StreamsMissingError(RuntimeError):
    """A worker with a credential found a stream missing: it may not declare one."""


async def require_streams(js: JetStreamContext, response_ttl: float) -> None:
    """Check the streams exist (a restricted user may look, not create)."""
    for cfg in stream_configs(response_ttl):
        try:
            await js.stream_info(cfg.name or "")
        except NotFoundError:
            raise StreamsMissingError(
                f"stream {cfg.name} does not exist; an admin declares the streams "
                "(`intentroute up` does) before the workers start"
            ) from None


async def prepare_streams(js: JetStreamContext, settings: CommonSettings) -> None:
    """Make sure the streams exist before a worker's consumers start: on an open server
    (no credential) the worker declares them, as it always has; a worker with a
    credential only checks, since streams are the admin's (`intentroute up`)."""
    if settings.nats_authenticated:
        await require_streams(js, settings.response_ttl)
    else:
        await ensure_streams(js, settings.response_ttl)


def broker_security(kwargs: dict[str, Any]) -> NatsSecurity | None:
    """`shared.natsconn.connect_kwargs` as FastStream's security object."""
    tls = kwargs.get("tls")
    if "user_credentials" in kwargs:
        return NatsCredentials(kwargs["user_credentials"], ssl_context=tls)
    if "user" in kwargs:
        return NatsUserPassword(kwargs["user"], kwargs.get("password", ""), ssl_context=tls)
    if "token" in kwargs:
        return NatsToken(kwargs["token"], ssl_context=tls)
    return NatsSecurity(ssl_context=tls) if tls is not None else None


def make_broker(settings: CommonSettings) -> NatsBroker:
    """The worker's connection (FastStream owns connect, reconnect and shutdown);
    stages read through `shared.consumer.StageConsumer` and publish through `Bus`."""
    # FastStream logs two lines per message at INFO; that costs more than a hop.
    quiet = logging.getLogger("intentroute.faststream")
    quiet.setLevel(logging.WARNING)
    kwargs = connect_kwargs(settings)
    extra: dict[str, Any] = {}
    if "inbox_prefix" in kwargs:
        extra["inbox_prefix"] = kwargs["inbox_prefix"]
    return NatsBroker(
        settings.nats_url,
        logger=quiet,
        graceful_timeout=10.0,
        max_reconnect_attempts=-1,
        # Try again soon after a server restart: the consumers pull again as soon as the
        # connection is back, so this is most of a restart's stall.
        # (FastStream annotates it int; nats-py takes seconds as a float.)
        reconnect_time_wait=0.25,  # type: ignore[arg-type]
        security=broker_security(kwargs),
        **extra,
    )


class Bus:
    """The publishing side of a worker: core and JetStream publishes on its connection,
    carrying the current trace context in the headers when tracing is on."""

    def __init__(self, nc: Client, *, tracing: bool = False) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.tracing = tracing

    def _headers(self, headers: dict[str, str] | None) -> dict[str, str] | None:
        if not self.tracing:
            return headers
        carrier = dict(headers or {})
        propagate.inject(carrier)
        return carrier

    async def publish(self, subject: str, payload: bytes) -> None:
        """Core publish: ordered on this connection, stored if a stream covers it."""
        await self.nc.publish(subject, payload, headers=self._headers(None))

    async def publish_durable(
        self, subject: str, payload: bytes, *, stream: str, msg_id: str
    ) -> None:
        """JetStream publish, returns once stored; the msg id makes a resend a no-op.

        The stream is checked on the ack rather than sent as an expected-stream
        header: one header fewer for the server to read on every hand-off."""
        ack = await self.js.publish(
            subject, payload, headers=self._headers({"Nats-Msg-Id": msg_id})
        )
        if ack.stream != stream:
            raise WrongStreamError(f"{subject} was stored in {ack.stream!r}, not {stream!r}")

    async def last_chunk(self, subject: str, stream: str) -> ResponseChunk | None:
        """The last chunk stored on a response subject (a redelivered stage resumes
        after it, or finds its answer already given)."""
        try:
            msg = await self.js.get_last_msg(stream, subject)
        except NotFoundError:
            return None
        return decode_chunk(msg.data or b"")


class WrongStreamError(RuntimeError):
    """A subject is captured by another stream than the one the contract names."""


async def publish_stage(bus: Publisher, subject: str, payload: bytes, *, msg_id: str) -> None:
    """Durable hand-off to the next stage; the msg id makes a re-publish after a crash a no-op."""
    await bus.publish_durable(subject, payload, stream=pipeline.STREAM, msg_id=msg_id)


class AnswerStream:
    """Publishes the ordered chunks of one answer on `agent.response.<agent>.<request_id>`.

    Text chunks go out as core publishes on one connection (ordered, stored by the
    AGENT_RESPONSES stream); the final chunk is a JetStream publish whose ack
    confirms the whole answer is stored, and whose msg id keeps it unique.

    The latest text piece is held back until the next one comes, so the last piece
    rides on the final chunk: one message fewer per answer (an answer made in one
    piece is a single chunk) for a one-piece delay in the stream.
    """

    def __init__(
        self, bus: Publisher, agent_id: str, request_id: str, *, start_seq: int = 0
    ) -> None:
        self._bus = bus
        self.agent_id = agent_id
        self.request_id = request_id
        self.subject = response_subject(agent_id, request_id)
        self.seq = start_seq
        self.text_parts: list[str] = []
        self._held = ""

    async def _send(self, chunk: ResponseChunk) -> None:
        await self._bus.publish(self.subject, encode(chunk))
        self.seq += 1

    async def _flush(self) -> None:
        if self._held:
            held, self._held = self._held, ""
            await self._send(ResponseChunk(request_id=self.request_id, seq=self.seq, text=held))

    async def text(self, text: str) -> None:
        if text:
            self.text_parts.append(text)
            await self._flush()
            self._held = text

    async def status(self, text: str) -> None:
        await self._flush()
        await self._send(
            ResponseChunk(
                request_id=self.request_id, seq=self.seq, text=text, kind=ChunkKind.STATUS
            )
        )

    async def reset(self) -> None:
        self.text_parts.clear()
        self._held = ""
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
        if kind == ChunkKind.FINAL and error is None and not text:
            text, self._held = self._held, ""
        else:
            await self._flush()
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
        if REDELIVERED.get() and await self._already_final():
            # Another delivery of this request (the server redelivered it while this one
            # was cut off from the server) answered meanwhile: one final chunk only.
            log.warning("[%s] answered by another delivery; final chunk not sent again",
                        self.request_id)
            return
        await self._bus.publish_durable(
            self.subject, encode(chunk), stream=response.STREAM,
            msg_id=f"{self.agent_id}:{self.request_id}:final",
        )
        self.seq += 1

    async def error(
        self, code: str, message: str, *, decision: RoutingDecision | None = None
    ) -> None:
        """The final chunk of an answer that failed: `code` is an `ErrorCode`."""
        await self.final(decision=decision, error=ErrorInfo(code=code, message=message))

    async def _already_final(self) -> bool:
        last = await self._bus.last_chunk(self.subject, response.STREAM)
        return last is not None and last.is_final

    @property
    def answer(self) -> str:
        return "".join(self.text_parts)
