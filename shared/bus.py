"""Bus wiring shared by every worker: broker factory, stream definitions, answer streaming.

Streams:
- AGENT_REQUESTS (`agent.request.*`), work-queue retention: the gateway's durable
  pull consumer shares requests among gateway replicas.
- INTENTROUTE_PIPELINE (`intentroute.stage.>`), work-queue retention: one durable
  pull consumer per stage (and per model slot for the generator).
- AGENT_RESPONSES (`agent.response.>`), limits retention with a TTL: every chunk is
  stored, so a subscriber that joins late still reads the whole answer.
- AGENT_FEEDBACK (`agent.feedback.*`), work-queue retention: agents' verdicts on their
  answers, read by the gateway's `gateway-feedback` durable consumer.

Every stream has the same number of replicas (`NATS_STREAM_REPLICAS`; 3 on a cluster).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from faststream.nats import NatsBroker
from faststream.nats.security import NatsCredentials, NatsSecurity, NatsToken, NatsUserPassword
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import Header, PubAck, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import (
    APIError,
    BadRequestError,
    NoStreamResponseError,
    NotFoundError,
    ServiceUnavailableError,
)
from opentelemetry import propagate

from shared.codec import decode_chunk, encode
from shared.contracts import deadletter, feedback, pipeline, request, response
from shared.contracts.response import ChunkKind, ErrorInfo, ResponseChunk, response_subject
from shared.contracts.routing import RoutingDecision
from shared.deadline import time_left
from shared.natsauth import STREAM_SUBJECTS
from shared.natsconn import connect_kwargs
from shared.ports import Publisher
from shared.settings import CommonSettings

log = logging.getLogger("intentroute.bus")
T = TypeVar("T")

# The run (`Admitted.run`) of the request a stage handles: its answer's final chunk is
# claimed for that run (AnswerStream.final).
ANSWER_RUN: ContextVar[str] = ContextVar("intentroute_answer_run", default="")


@dataclass(frozen=True)
class Lease:
    """What a stage knows of the delivery it handles. While it is the message's first
    delivery, its connection has not been lost since, and less than half its ack wait
    has passed, the server cannot have redelivered it: it is the only one, and its
    final chunk needs no claim (AnswerStream.final)."""

    first: bool
    until: float  # time.monotonic()
    reconnects: Callable[[], int]
    at_start: int

    @classmethod
    def start(cls, deliveries: int, ack_wait: float, reconnects: Callable[[], int]) -> Lease:
        return cls(first=deliveries == 1, until=time.monotonic() + ack_wait / 2,
                   reconnects=reconnects, at_start=reconnects())

    def sole(self) -> bool:
        return (self.first and time.monotonic() < self.until
                and self.reconnects() == self.at_start)


ANSWER_LEASE: ContextVar[Lease | None] = ContextVar("intentroute_answer_lease", default=None)
_MAC_BYTES = hashlib.sha256().digest_size
# JetStream's error code for a publish whose expected last subject sequence failed.
_JS_WRONG_LAST_SEQUENCE = 10071


def _stream(name: str, retention: RetentionPolicy, max_age: float, *,
            duplicate_window: float = 120) -> StreamConfig:
    """A file-backed stream on the subjects the permission table gives it
    (`duplicate_window` 0: the server's default)."""
    return StreamConfig(name=name, subjects=list(STREAM_SUBJECTS[name]), retention=retention,
                        storage=StorageType.FILE, max_age=max_age,
                        duplicate_window=duplicate_window)


def stream_configs(response_ttl: float, replicas: int = 1) -> list[StreamConfig]:
    day = 24 * 3600
    configs = [
        _stream(request.STREAM, RetentionPolicy.WORK_QUEUE, day),
        _stream(pipeline.STREAM, RetentionPolicy.WORK_QUEUE, day),
        _stream(response.STREAM, RetentionPolicy.LIMITS, response_ttl),
        _stream(feedback.STREAM, RetentionPolicy.WORK_QUEUE, day),
        # One final chunk per run of a request, kept as long as the answers.
        _stream(response.CLAIM_STREAM, RetentionPolicy.LIMITS, response_ttl),
        # Messages that exhausted their deliveries, kept a week for an operator.
        _stream(deadletter.STREAM, RetentionPolicy.LIMITS, 7 * day, duplicate_window=0),
    ]
    for cfg in configs:
        cfg.num_replicas = replicas
    return configs


# A publish whose outcome is unknown: no ack within the timeout, nobody to store it yet.
_UNACKED = (NatsTimeoutError, TimeoutError, NoRespondersError, NoStreamResponseError,
            ServiceUnavailableError)
# How long an answer's final chunk is re-sent at most (less when the deadline is nearer):
# a NATS cluster elects a lost stream leader within about ten seconds.
FINAL_RESEND_WINDOW = 30.0
# Seconds to wait for the ack of one attempt (an ack normally takes milliseconds).
FINAL_ACK_WAIT = 1.0

# A cluster that has just started answers these until its JetStream leader is elected
# and its peers have joined (503 "JetStream system temporarily unavailable",
# "insufficient resources" while too few peers are known, or no answer yet).
_NOT_READY = (ServiceUnavailableError, NoRespondersError, NatsTimeoutError, TimeoutError)
_JS_INSUFFICIENT_RESOURCES = 10023
_JS_NO_PEERS = 10005


async def ensure_streams(
    js: JetStreamContext, response_ttl: float, replicas: int = 1, *, timeout: float = 30.0
) -> None:
    """Create or update the streams; every worker may call it at start. Waits (up to
    `timeout`) for a cluster that is still electing its leaders."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    for cfg in stream_configs(response_ttl, replicas):
        async def declare(cfg: StreamConfig = cfg) -> None:
            try:
                await js.add_stream(config=cfg)
            except BadRequestError:
                await js.update_stream(config=cfg)

        await until_ready(declare, f"stream {cfg.name}", max(0.0, deadline - loop.time()))


class StreamsMissingError(RuntimeError):
    """A worker with a credential found a stream missing: it may not declare one."""


async def require_streams(
    js: JetStreamContext, response_ttl: float, *, timeout: float = 30.0
) -> None:
    """Check the streams exist (a restricted user may look, not create); waits, up to
    `timeout`, for a stream that has no leader yet (a cluster electing one)."""
    for cfg in stream_configs(response_ttl, 1):
        try:
            await until_ready(partial(js.stream_info, cfg.name or ""), f"stream {cfg.name}",
                              timeout)
        except NotFoundError:
            raise StreamsMissingError(
                f"stream {cfg.name} does not exist; an admin declares the streams "
                "(`intentroute up` does) before the workers start"
            ) from None


async def until_ready(op: Callable[[], Awaitable[T]], what: str, timeout: float = 30.0) -> T:
    """`op()`, tried again while JetStream is not ready for it (a cluster starting or
    electing a leader: no answer, 503, too few peers yet), up to `timeout`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            return await op()
        except (*_NOT_READY, APIError) as exc:
            transient = isinstance(exc, _NOT_READY) or (
                isinstance(exc, APIError)
                and exc.err_code in (_JS_INSUFFICIENT_RESOURCES, _JS_NO_PEERS))
            if not transient or loop.time() > deadline:
                raise
            log.info("%s: JetStream not ready yet (%r); retrying", what, exc)
            await asyncio.sleep(0.25)


async def prepare_streams(js: JetStreamContext, settings: CommonSettings) -> None:
    """Make sure the streams exist before a worker's consumers start: on an open server
    (no credential) the worker declares them, as it always has; a worker with a
    credential only checks, since streams are the admin's (`intentroute up`)."""
    if settings.nats_authenticated:
        await require_streams(js, settings.response_ttl)
    else:
        await ensure_streams(js, settings.response_ttl, settings.replicas())


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
        settings.nats_servers,
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

    def __init__(self, nc: Client, *, tracing: bool = False, claim_key: bytes = b"") -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.tracing = tracing
        # Claims are sealed with the workers' key: an agent can make the server deliver
        # its own responses onto any subject (a push consumer's deliver subject escapes
        # permissions), a claim subject included, but it cannot seal them.
        self._claim_key = claim_key

    def _seal(self, payload: bytes) -> bytes:
        return hmac.new(self._claim_key, payload, hashlib.sha256).digest() + payload

    def _unseal(self, sealed: bytes) -> bytes | None:
        mac, payload = sealed[:_MAC_BYTES], sealed[_MAC_BYTES:]
        return payload if hmac.compare_digest(mac, self._seal(payload)[:_MAC_BYTES]) else None

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
        _stored_in(ack, subject, stream)

    async def publish_first(
        self, subject: str, payload: bytes, *, stream: str, msg_id: str
    ) -> bytes | None:
        """Store `payload` (sealed) on `subject` unless something is stored there
        already, and return what is stored: `payload`, the claim that came first, or
        None if what is there is no claim (not sealed with the workers' key). A resend
        under the same msg id after a lost ack finds its own message."""
        headers = {"Nats-Msg-Id": msg_id, Header.EXPECTED_LAST_SUBJECT_SEQUENCE: "0"}
        try:
            ack = await self.js.publish(subject, self._seal(payload),
                                        headers=self._headers(headers))
        except APIError as exc:
            if exc.err_code != _JS_WRONG_LAST_SEQUENCE:
                raise
            return await self.claimed(subject, stream=stream)
        _stored_in(ack, subject, stream)
        # Stored now, or (a duplicate) by this msg id's earlier publish: ours either way.
        return payload

    async def stored(self, subject: str, *, stream: str, msg_id: str) -> bytes | None:
        """The message `stream` holds on `subject` under `msg_id`, if any (reads the
        subject's messages one by one: for the few chunks of one answer)."""
        seq = 1
        while True:
            try:
                msg = await self.js.get_msg(stream, seq=seq, subject=subject, next=True)
            except NotFoundError:
                return None
            if (msg.headers or {}).get("Nats-Msg-Id") == msg_id:
                return msg.data or b""
            seq = (msg.seq or seq) + 1

    async def claimed(self, subject: str, *, stream: str) -> bytes | None:
        """The claim stored on a claim subject, if there is one (sealed)."""
        try:
            return self._unseal((await self.js.get_last_msg(stream, subject)).data or b"")
        except NotFoundError:
            return None

    def reconnects(self) -> int:
        return int(self.nc.stats["reconnects"])

    async def last_chunk(self, subject: str, stream: str) -> ResponseChunk | None:
        """The last chunk stored on a response subject (a redelivered stage resumes
        after it, or finds its answer already given)."""
        try:
            msg = await self.js.get_last_msg(stream, subject)
        except NotFoundError:
            return None
        return decode_chunk(msg.data or b"")


def _stored_in(ack: PubAck, subject: str, stream: str) -> None:
    if ack.stream != stream:
        raise WrongStreamError(f"{subject} was stored in {ack.stream!r}, not {stream!r}")


def _seq_of(payload: bytes) -> int:
    try:
        return decode_chunk(payload).seq
    except Exception:  # not a chunk: no order to keep
        return -1


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

    Exactly one final chunk per run of a request, even when two deliveries of it answer
    at once (one cut off from the server mid-answer, the other its redelivery): before
    it is sent, the final chunk is stored as the run's claim (ANSWER_CLAIMS, only if no
    claim is stored yet). A delivery that finds another's claim sends that chunk, byte
    for byte, if it is not stored yet, so a caller never sees two different finals.

    The latest text piece is held back until the next one comes, so the last piece
    rides on the final chunk: one message fewer per answer (an answer made in one
    piece is a single chunk) for a one-piece delay in the stream.
    """

    def __init__(
        self, bus: Publisher, agent_id: str, request_id: str, *, start_seq: int = 0,
        run: str | None = None,
    ) -> None:
        self._bus = bus
        self.agent_id = agent_id
        self.request_id = request_id
        # The run whose one final chunk this stream claims (the stage's, by default).
        self.run = ANSWER_RUN.get() if run is None else run
        self._claim_id = uuid.uuid4().hex
        self._final_id = f"{agent_id}:{request_id}:final:{self.run}"
        self._claim_subject = response.claim_subject(agent_id, request_id, self.run)
        self.subject = response_subject(agent_id, request_id)
        self.seq = start_seq
        self.text_parts: list[str] = []
        self._held = ""
        # Epoch seconds when the first piece of the answer's text went out (None: not
        # yet; an answer made in one piece goes out with the final chunk).
        self.first_text_at: float | None = None

    @classmethod
    async def resume(
        cls, bus: Publisher, agent_id: str, request_id: str, *, start_seq: int,
        redelivered: bool,
    ) -> AnswerStream:
        """The answer stream of a stage that may have run on this message before: a
        redelivery goes on after whatever an earlier delivery stored (a worker that died,
        or lost its connection, mid-answer) and resets it, so seqs keep increasing."""
        if redelivered:
            last = await bus.last_chunk(response_subject(agent_id, request_id),
                                        response.STREAM)
            if last is not None and last.seq >= start_seq:
                stream = cls(bus, agent_id, request_id, start_seq=last.seq + 1)
                await stream.reset()
                return stream
        return cls(bus, agent_id, request_id, start_seq=start_seq)

    async def _send(self, chunk: ResponseChunk) -> None:
        await self._bus.publish(self.subject, encode(chunk))
        self.seq += 1

    async def _flush(self) -> None:
        if self._held:
            held, self._held = self._held, ""
            if self.first_text_at is None:
                self.first_text_at = time.time()
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
        self.first_text_at = None
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
        payload = encode(chunk)
        lease = ANSWER_LEASE.get()
        # No other delivery of this run can exist under a lease: no claim needed.
        if not (lease is not None and lease.sole() and await self._sent_alone(payload)):
            await self._claimed_final(payload)
        self.seq += 1

    async def _sent_alone(self, payload: bytes) -> bool:
        """One attempt without a claim; if its ack is lost, False: the claim decides
        (a redelivery may answer meanwhile)."""
        try:
            await asyncio.wait_for(self._publish_final(payload), FINAL_ACK_WAIT)
        except _UNACKED:
            return False
        return True

    async def final_stored(self) -> bool:
        """Is this run's final chunk stored (by any delivery)?"""
        return await self._bus.stored(self.subject, stream=response.STREAM,
                                      msg_id=self._final_id) is not None

    async def send_claimed(self) -> bool:
        """For a redelivery, before it answers: True if another delivery of this run
        claimed its final chunk (it may be alive, cut off, or dead), which is then sent
        byte for byte unless it is stored, instead of a second answer."""
        claimed = await self._bus.claimed(self._claim_subject, stream=response.CLAIM_STREAM)
        if claimed is None:
            return False
        if not await self.final_stored():
            log.warning("[%s] sending the final chunk an earlier delivery claimed",
                        self.request_id)
            await self._until_acked(lambda: self._publish_final(claimed))
        return True

    async def _claimed_final(self, payload: bytes) -> None:
        """Send the run's one final chunk: `payload` if this delivery claims the run
        first, or the chunk that was claimed first, or nothing if it is stored."""
        claimed = await self._until_acked(lambda: self._bus.publish_first(
            self._claim_subject, payload, stream=response.CLAIM_STREAM,
            msg_id=self._claim_id))
        if claimed is None:
            # Not a claim any worker made: an agent's deliveries pointed at the subject.
            log.error("[%s] %s holds a forged claim; answering without one",
                      self.request_id, self._claim_subject)
            claimed = payload
        # Stored already (by the claimant, or by a first delivery that needed no claim),
        # wherever on the subject: this delivery's own chunks may have followed it.
        if await self.final_stored():
            log.warning("[%s] answered by another delivery; final chunk not sent again",
                        self.request_id)
            return
        if claimed != payload:
            # Another delivery of this run (the server redelivered the message while
            # this one was cut off, or this one is the redelivery) claimed the answer
            # first and has not sent it (it may have died): it goes out byte for byte,
            # unless this delivery's chunks went past it (it was never stored, nor seen):
            # then this delivery's own final goes, so the answer never goes back.
            if _seq_of(claimed) < self.seq:
                claimed = payload
            log.warning("[%s] sending the final chunk %s claimed", self.request_id,
                        "this delivery" if claimed == payload else "another delivery")
        await self._until_acked(lambda: self._publish_final(claimed))

    async def _publish_final(self, payload: bytes) -> None:
        await self._bus.publish_durable(self.subject, payload, stream=response.STREAM,
                                        msg_id=self._final_id)

    async def _until_acked(self, op: Callable[[], Awaitable[T]]) -> T:
        """`op()` (a publish of the final chunk or its claim) until the stream acknowledges it.

        A live subscriber gets the chunk as it is published, the stream stores it when
        it has a leader: a publish whose ack is lost (a cluster electing the stream's
        new leader, a server restarting) may have reached the caller all the same. It
        is sent again as it was, the same bytes under the same msg id, so the stream
        stores it once and a caller that saw it sees an identical copy, never a second
        answer (which a redelivery, generating again, could be). Up to the request's
        deadline; then the error goes up and the message is redelivered."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + time_left(FINAL_RESEND_WINDOW)
        attempt = 0
        while True:
            try:
                # Each attempt briefly: a copy stored soon after the stream is back is
                # what a redelivery of this request (on another replica, once this one's
                # progress acks were lost too) finds, instead of answering again.
                return await asyncio.wait_for(op(), FINAL_ACK_WAIT)
            except _UNACKED as exc:
                attempt += 1
                if loop.time() >= give_up:
                    raise
                log.warning("[%s] final chunk not acknowledged (%r); sending it again",
                            self.request_id, exc)
                # A timeout has waited already; a quick refusal (503) waits a little.
                await asyncio.sleep(min(0.05 * 2 ** attempt, 0.25))

    async def error(
        self, code: str, message: str, *, decision: RoutingDecision | None = None
    ) -> None:
        """The final chunk of an answer that failed: `code` is an `ErrorCode`."""
        await self.final(decision=decision, error=ErrorInfo(code=code, message=message))

    @property
    def answer(self) -> str:
        return "".join(self.text_parts)
