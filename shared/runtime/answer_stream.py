"""Streaming one answer (`AnswerStream`): text chunks in order, exactly one final chunk per
run of a request (claimed in ANSWER_CLAIMS when another delivery may have company), reset
when a stage restarts an answer."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import (
    NoStreamResponseError,
    ServiceUnavailableError,
)

from shared.common.deadline import time_left
from shared.contracts import response
from shared.contracts.codec import decode_chunk, encode
from shared.contracts.response import (
    CachedFrom,
    ChunkKind,
    ErrorInfo,
    PartInfo,
    PartResult,
    ResponseChunk,
    TokenUsage,
    response_subject,
)
from shared.contracts.routing import RoutingDecision
from shared.runtime.ports import Publisher

log = logging.getLogger("intentroute.bus")
T = TypeVar("T")


# The run (`Admitted.run`) of the request a stage handles: its answer's final chunk is
# claimed for that run (AnswerStream.final).
ANSWER_RUN: ContextVar[str] = ContextVar("intentroute_answer_run", default="")


# Seconds the workers' clocks may be behind the NATS server's (the lease compares the
# server's storage time of a message with the worker's clock): NTP keeps hosts within
# milliseconds; on one machine it is 0.
CLOCK_SKEW = 0.25


@dataclass(frozen=True)
class Lease:
    """What a stage knows of the delivery it handles, from what the server says of it.
    The server stored the message at `stored_at` (its clock) and delivered it first at or
    after that; it redelivers no sooner than one ack wait after a delivery. So while it
    is the message's first delivery, less than half an ack wait (less the clock skew) has
    passed since the message was *stored*, and the connection has not been lost since,
    no other delivery can exist: its final chunk needs no claim (AnswerStream.final).
    Counting from when the server stored the message, not from when the handler started,
    keeps a delivery that waited in a stopped or slow process's buffer from looking
    fresh. A message stored at an unknown time (0) never has a lease."""

    first: bool
    until: float  # time.time()
    reconnects: Callable[[], int]
    at_start: int

    @classmethod
    def start(cls, deliveries: int, ack_wait: float, reconnects: Callable[[], int],
              stored_at: float) -> Lease:
        until = stored_at + ack_wait / 2 - CLOCK_SKEW if stored_at > 0 else 0.0
        return cls(first=deliveries == 1, until=until, reconnects=reconnects,
                   at_start=reconnects())

    def sole(self, now: float | None = None) -> bool:
        return (self.first and (time.time() if now is None else now) < self.until
                and self.reconnects() == self.at_start)


ANSWER_LEASE: ContextVar[Lease | None] = ContextVar("intentroute_answer_lease", default=None)




_UNACKED = (NatsTimeoutError, TimeoutError, NoRespondersError, NoStreamResponseError,
            ServiceUnavailableError)
# How long an answer's final chunk is re-sent at most (less when the deadline is nearer):
# a NATS cluster elects a lost stream leader within about ten seconds.
FINAL_RESEND_WINDOW = 30.0
# Seconds to wait for the ack of one attempt (an ack normally takes milliseconds).
FINAL_ACK_WAIT = 1.0
# Seconds a delivery that lost the claim, with its own chunks past the claimed final,
# waits for the claimant to store that final before it sends its own instead: the
# claimant is alive in all but a kill between its claim and its final, and sends it
# within milliseconds of its claim (`bench chaos` saw both go out when it did not wait).
CLAIMANT_WAIT = 2 * FINAL_ACK_WAIT


def _seq_of(payload: bytes) -> int:
    try:
        return decode_chunk(payload).seq
    except Exception:  # not a chunk: no order to keep
        return -1


class AnswerStream:
    """Publishes the ordered chunks of one answer on `agent.response.<agent>.<request_id>`.

    Text chunks go out as core publishes on one connection (ordered, stored by the
    AGENT_RESPONSES stream); the final chunk is a JetStream publish whose ack
    confirms the whole answer is stored, and whose msg id keeps it unique.

    Exactly one final chunk per run of a request, even when two deliveries of it answer
    at once (one cut off from the server mid-answer, the other its redelivery): before
    it is sent, the final chunk is stored as the run's claim (ANSWER_CLAIMS, only if no
    claim is stored yet). A delivery that finds another's claim sends that chunk, byte
    for byte, if it is not stored yet, so a caller never sees two different finals; one
    whose own chunks went past the claimed one waits for the claimant to store it (up to
    CLAIMANT_WAIT) and sends its own final only if it does not come.

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
        self._sent_subject = response.sent_subject(agent_id, request_id, self.run)
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

    async def flush(self) -> None:
        """Send the text piece held back (a part ends without a final chunk)."""
        await self._flush()

    async def part(self, info: PartInfo, heading: str) -> None:
        """A part marker (a split message's next request begins): the text held back
        goes first; `heading` is its text, so a client that knows no markers reads each
        part under its heading."""
        await self._flush()
        self.text_parts.clear()
        await self._send(ResponseChunk(request_id=self.request_id, seq=self.seq,
                                       text=heading, kind=ChunkKind.PART, part=info))

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
        usage: TokenUsage | None = None,
        cached_from: CachedFrom | None = None,
        parts: list[PartResult] | None = None,
        query_type: str | None = None,
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
            query_type=(query_type if query_type is not None
                        else decision.type.value if decision else ""),
            validation_status=validation_status,
            error=error,
            decision=decision,
            avap_code=avap_code,
            answered_by=answered_by,
            retried=retried,
            usage=usage,
            cached_from=cached_from,
            parts=parts or [],
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
        """Is this run's final chunk stored (by any delivery)? Two reads by subject, no
        scan (a worker may not read the answers by sequence): the final is the last
        message on the answer subject (one sent under a lease: no other delivery
        streams after it, and a redelivery asks this before it streams anything), or
        the claimed final was marked sent by the delivery that stored it."""
        if await self._bus.stored(self.subject, stream=response.STREAM,
                                  msg_id=self._final_id) is not None:
            return True
        return await self._bus.claimed(self._sent_subject,
                                       stream=response.CLAIM_STREAM) is not None

    async def _mark_sent(self) -> None:
        """The claimed final is stored: say so where `final_stored` reads it (a delivery
        streaming after it would hide it from the answer subject's last message). If
        this mark is lost, a later delivery sends the same bytes under the same msg id:
        the stream keeps one copy."""
        await self._until_acked(lambda: self._bus.publish_first(
            self._sent_subject, self._final_id.encode(), stream=response.CLAIM_STREAM,
            msg_id=f"{self._final_id}:sent"))

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
            await self._mark_sent()
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
            # unless this delivery's chunks went past it: then this delivery's own final
            # goes, so the answer never goes back, but only once the claimant has had
            # the time to store its own (alive, it is sending it now: two different
            # finals would reach the caller, the stream keeping one).
            if _seq_of(claimed) < self.seq:
                if await self._stored_within(CLAIMANT_WAIT):
                    log.warning("[%s] answered by the delivery that claimed it; final "
                                "chunk not sent", self.request_id)
                    return
                claimed = payload
            log.warning("[%s] sending the final chunk %s claimed", self.request_id,
                        "this delivery" if claimed == payload else "another delivery")
        await self._until_acked(lambda: self._publish_final(claimed))
        await self._mark_sent()

    async def _stored_within(self, seconds: float) -> bool:
        """Is this run's final stored within `seconds`? Read 50, 100 and 200 ms from
        now, then every 200 ms: the caller has just read that it is not."""
        loop = asyncio.get_running_loop()
        until = loop.time() + time_left(seconds)
        pause = 0.05
        while loop.time() + pause <= until:
            await asyncio.sleep(pause)
            if await self.final_stored():
                return True
            pause = min(pause * 2, 0.2)
        return False

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
