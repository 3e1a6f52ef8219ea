"""The bus as a stage's logic sees it: what it publishes through, the delivery it handles.
Adapters (`shared.runtime.bus`, `shared.runtime.consumer`) implement them; tests pass fakes."""

from __future__ import annotations

from typing import Protocol

from shared.contracts.response import ResponseChunk


class Publisher(Protocol):
    """The publishing side of a worker's bus connection."""

    async def publish(self, subject: str, payload: bytes) -> None:
        """Core publish: ordered on this connection, stored if a stream covers it."""

    async def publish_durable(
        self, subject: str, payload: bytes, *, stream: str, msg_id: str
    ) -> None:
        """JetStream publish that returns once stored; `msg_id` makes a resend a no-op."""

    async def publish_first(
        self, subject: str, payload: bytes, *, stream: str, msg_id: str
    ) -> bytes | None:
        """Store `payload` on `subject` unless a message is stored there already; return
        the one stored (`payload`, or the earlier one; None if that is no valid claim)."""

    async def stored(self, subject: str, *, stream: str, msg_id: str) -> bytes | None:
        """The message `stream` holds on `subject` under `msg_id` (None: none)."""

    async def claimed(self, subject: str, *, stream: str) -> bytes | None:
        """The claim stored on a claim subject (None: none, or none valid)."""

    def reconnects(self) -> int:
        """How often the connection was re-established (a delivery that spans one may
        have been redelivered meanwhile)."""

    async def last_chunk(self, subject: str, stream: str) -> ResponseChunk | None:
        """The last chunk stored on a response subject (None if there is none)."""


class Delivery(Protocol):
    """One JetStream message as a stage handler sees it."""

    @property
    def data(self) -> bytes: ...

    @property
    def subject(self) -> str: ...

    @property
    def deliveries(self) -> int:
        """How many times JetStream has delivered it (1 on the first try)."""

    @property
    def stream_seq(self) -> int:
        """Its sequence in its stream (the same for every delivery of it)."""

    @property
    def stored_at(self) -> float:
        """When its stream stored it, by the server's clock (epoch seconds; 0: unknown)."""

    @property
    def settled(self) -> bool:
        """Acked or nacked already (by the handler)."""

    async def nack(self, delay: float | None = None) -> None:
        """Give the message back for redelivery (a retryable error)."""

    async def in_progress(self) -> None:
        """Reset the redelivery timer: the handler is alive, just slow."""

    async def dead_letter(self, stage: str, reason: str) -> None:
        """Park the message in the dead-letter stream with its stage and reason, and
        acknowledge it: it is never delivered again (`intentroute dlq replay` can)."""
