"""The publishing side of a worker (`Bus`): core and JetStream publishes, stage hand-offs,
the answer claims' sealed payloads."""

from __future__ import annotations

import asyncio
import hashlib
import hmac

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import Header, PubAck
from nats.js.errors import (
    APIError,
    NotFoundError,
)
from opentelemetry import propagate

from shared.contracts import pipeline
from shared.contracts.codec import decode_chunk
from shared.contracts.errors import RetryableError
from shared.contracts.response import ResponseChunk
from shared.runtime.ports import Publisher

_MAC_BYTES = hashlib.sha256().digest_size
# JetStream's error code for a publish whose expected last subject sequence failed.
_JS_WRONG_LAST_SEQUENCE = 10071
# Reads of a claim the stream says exists (a replica catching up answers not found).
_CLAIM_READS = 5


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
            return await self._first_claim(subject, stream)
        _stored_in(ack, subject, stream)
        # Stored now, or (a duplicate) by this msg id's earlier publish: ours either way.
        return payload

    async def stored(self, subject: str, *, stream: str, msg_id: str) -> bytes | None:
        """The last message `stream` holds on `subject` when it was stored under
        `msg_id` (else None). A direct get by subject: a worker reads only the subjects
        it names, never a stream by sequence (its grant allows no more)."""
        try:
            msg = await self.js.get_last_msg(stream, subject, direct=True)
        except NotFoundError:
            return None
        if (msg.headers or {}).get("Nats-Msg-Id") != msg_id:
            return None
        return msg.data or b""

    async def claimed(self, subject: str, *, stream: str) -> bytes | None:
        """The claim stored on a claim subject, if there is one (sealed)."""
        try:
            msg = await self.js.get_last_msg(stream, subject, direct=True)
        except NotFoundError:
            return None
        return self._unseal(msg.data or b"")

    async def _first_claim(self, subject: str, stream: str) -> bytes | None:
        """The claim the stream refused ours for. It is stored (the refusal says so),
        but on a cluster a direct get may be answered by a replica that has not applied
        it yet: not found is read again, briefly, before it counts as no claim."""
        for attempt in range(_CLAIM_READS):
            try:
                msg = await self.js.get_last_msg(stream, subject, direct=True)
            except NotFoundError:
                await asyncio.sleep(0.02 * (attempt + 1))
                continue
            return self._unseal(msg.data or b"")
        return None

    def reconnects(self) -> int:
        return int(self.nc.stats["reconnects"])

    async def last_chunk(self, subject: str, stream: str) -> ResponseChunk | None:
        """The last chunk stored on a response subject (a redelivered stage resumes
        after it, or finds its answer already given): a direct get by subject."""
        try:
            msg = await self.js.get_last_msg(stream, subject, direct=True)
        except NotFoundError:
            return None
        return decode_chunk(msg.data or b"")


def _stored_in(ack: PubAck, subject: str, stream: str) -> None:
    if ack.stream != stream:
        raise WrongStreamError(f"{subject} was stored in {ack.stream!r}, not {stream!r}")


class WrongStreamError(RetryableError):
    """A subject is captured by another stream than the one the contract names."""


async def publish_stage(bus: Publisher, subject: str, payload: bytes, *, msg_id: str) -> None:
    """Durable hand-off to the next stage; the msg id makes a re-publish after a crash a no-op."""
    await bus.publish_durable(subject, payload, stream=pipeline.STREAM, msg_id=msg_id)
