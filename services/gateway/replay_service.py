"""Late replay, served by the gateway (contract: shared/contracts/replay.py).

An agent that joins late asks on `agent.replay.<agent_id>` (a core request only that
agent may publish) with a request id; the gateway reads `agent.response.<agent_id>.
<request_id>` from its first stored chunk through a short-lived consumer of its own
(named, filtered to that one subject, in memory, removed when the replay ends and by the
server after `INACTIVE_THRESHOLD` if this replica dies) and sends each chunk to the
caller's inbox as it was sent live, until the final one. The agent is the subject's, so
a request id of another agent reads the asker's own (empty) subject: UNKNOWN_REQUEST.

A reply subject is never taken on trust: a replay is answered only on a reply subject
that leads back to the asker alone. Through an agent's own account (every agent's, on a
stack with auth: shared.auth.permissions) the server replaces the caller's reply subject
with a mapping of its own (`_R_.…`, which no client may set) into that account; a
caller in the stack's account must use the agent's own inbox (`_INBOX.<agent_id>.…`),
or be the doors (`_INBOX.intentroute-doors.…`: they follow answers on agents' behalf).
Anything else (another agent's answer or request subject, the JetStream API) is refused
without a reply, one log line per `REFUSED_LOG_EVERY` seconds at most.

Agents hold no JetStream consumer grant at all: a consumer's deliver subject escapes
subject permissions (a push consumer could store an agent's chunks on any stream's
subjects), and a durable one never expires. The gateway's consumers are bounded by
`GATEWAY_REPLAY_CONCURRENCY` per replica and by the stream's `max_consumers`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from shared.auth.natsconn import inbox_prefix
from shared.auth.permissions import (
    DOORS,
    REPLAY_MAX_REPLIES,
    REPLAY_REPLY_SECONDS,
    service_user,
)
from shared.contracts import replay as replay_contract
from shared.contracts import response as response_contract
from shared.contracts.codec import decode_chunk, encode
from shared.contracts.ids import MAX_ID_CHARS, is_valid_id
from shared.contracts.response import (
    ChunkKind,
    ErrorCode,
    ErrorInfo,
    ResponseChunk,
    response_subject,
)

log = logging.getLogger("intentroute.gateway.replay")

# Seconds the server keeps a replay consumer nobody reads (a replica that died mid-replay).
INACTIVE_THRESHOLD = 30.0
# The caller's reply subject takes at most REPLAY_MAX_REPLIES messages within
# REPLAY_REPLY_SECONDS (the server's allow_responses for the gateway): a replay stops
# before either, with a final error chunk in the last allowed message.
_MARGIN_S = 5.0
_NOT_STORED = "no stored answer for this request id"
# The server's reply mapping of a service import (nats-server refuses it as a client's
# own reply subject, so only the server can have set it).
_SERVICE_REPLY = "_R_."
REFUSED_LOG_EVERY = 10.0


# The doors ask on behalf of every agent (their answers' replays after a reconnect):
# their inbox, which only their NATS user may read, leads back to the asker too.
_DOORS_INBOX = f"{inbox_prefix(service_user(DOORS))}."


def reply_is_the_askers(reply: str, agent: str) -> bool:
    """Does `reply` lead back to `agent` only (see the module doc)?"""
    return reply.startswith((_SERVICE_REPLY, f"{inbox_prefix(agent)}.", _DOORS_INBOX))


def error_chunk(request_id: str, code: ErrorCode, message: str, *, seq: int = 0,
                retry_after_ms: int = 0) -> bytes:
    return encode(ResponseChunk(
        request_id=request_id, seq=seq, kind=ChunkKind.FINAL, is_final=True,
        error=ErrorInfo(code, message, retry_after_ms=retry_after_ms)))


class ReplayService:
    """Answers `agent.replay.*` (queue group: one replica per request)."""

    def __init__(self, nc: Client, *, follow_for: float, concurrency: int,
                 check_reply: bool = True) -> None:
        self._nc = nc
        # Off only on a server without credentials, where nobody's identity is known.
        self._check_reply = check_reply
        # An answer still in progress is followed this long at most (its deadline).
        self._follow_for = max(1.0, min(follow_for, REPLAY_REPLY_SECONDS - _MARGIN_S))
        self._slots = asyncio.Semaphore(max(1, concurrency))
        self._tasks: set[asyncio.Task[None]] = set()
        self._sub: Subscription | None = None
        self._refused = 0
        self._refused_logged_at = -REFUSED_LOG_EVERY

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(
            replay_contract.SUBJECTS, queue=replay_contract.QUEUE, cb=self._on_request)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _on_request(self, msg: Msg) -> None:
        if not msg.reply:
            return  # nobody to answer
        if self._check_reply and not reply_is_the_askers(
                msg.reply, replay_contract.agent_of(msg.subject)):
            self._refuse(msg)
            return
        if self._slots.locked():
            request_id = msg.data[:MAX_ID_CHARS].decode("utf-8", errors="replace")
            await self._nc.publish(msg.reply, error_chunk(
                request_id, ErrorCode.CONCURRENCY_LIMITED,
                "too many replays in progress; ask again shortly", retry_after_ms=1000))
            return
        task = asyncio.create_task(self._serve(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _refuse(self, msg: Msg) -> None:
        """A reply subject that is not the asker's: nothing is sent; counted, and logged
        at most once per REFUSED_LOG_EVERY seconds (a caller cannot flood the log)."""
        self._refused += 1
        now = time.monotonic()
        if now - self._refused_logged_at >= REFUSED_LOG_EVERY:
            self._refused_logged_at = now
            log.warning("[gateway] replay requests with a reply subject that is not the "
                        "asker's refused: %d so far (latest on %s, reply %.80r)",
                        self._refused, msg.subject, msg.reply)

    async def _serve(self, msg: Msg) -> None:
        agent = replay_contract.agent_of(msg.subject)
        request_id = msg.data.decode("utf-8", errors="replace").strip()
        async with self._slots:
            try:
                await self.replay(agent, request_id, msg.reply)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the caller gets a final chunk, the log one line
                log.warning("[gateway] replay of %r for %r failed: %r", request_id[:MAX_ID_CHARS],
                            agent, exc)
                with contextlib.suppress(Exception):
                    await self._nc.publish(msg.reply, error_chunk(
                        request_id[:MAX_ID_CHARS], ErrorCode.STAGE_FAILED,
                        "the replay failed; ask again"))

    async def replay(self, agent: str, request_id: str, reply: str) -> None:
        """Send `agent`'s stored answer `request_id` to `reply`, or UNKNOWN_REQUEST."""
        js = self._nc.jetstream()
        if not is_valid_id(agent) or not is_valid_id(request_id):
            await self._nc.publish(reply, error_chunk(
                request_id[:MAX_ID_CHARS], ErrorCode.UNKNOWN_REQUEST, _NOT_STORED))
            return
        subject = response_subject(agent, request_id)
        try:  # anything stored at all? (no consumer for an id that has nothing)
            await js.get_last_msg(response_contract.STREAM, subject, direct=True)
        except NotFoundError:
            await self._nc.publish(reply, error_chunk(
                request_id, ErrorCode.UNKNOWN_REQUEST, _NOT_STORED))
            return
        inbox = self._nc.new_inbox()
        sub = await self._nc.subscribe(inbox)
        name = f"replay-{uuid.uuid4().hex[:16]}"
        try:
            await js.add_consumer(response_contract.STREAM, ConsumerConfig(
                name=name, filter_subject=subject, deliver_subject=inbox,
                deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE,
                inactive_threshold=INACTIVE_THRESHOLD, mem_storage=True, num_replicas=1))
            await self._forward(sub, request_id, reply)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            with contextlib.suppress(Exception):
                await js.delete_consumer(response_contract.STREAM, name)

    async def _forward(self, sub: Subscription, request_id: str, reply: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._follow_for
        last_seq = 0
        for _ in range(REPLAY_MAX_REPLIES - 1):
            remaining = deadline - loop.time()
            try:
                if remaining <= 0:
                    raise nats.errors.TimeoutError
                msg = await sub.next_msg(timeout=remaining)
            except nats.errors.TimeoutError:
                await self._nc.publish(reply, error_chunk(
                    request_id, ErrorCode.DEADLINE_EXCEEDED,
                    "the answer was still incomplete when the replay ended",
                    seq=last_seq + 1))
                return
            await self._nc.publish(reply, msg.data)
            try:
                chunk = decode_chunk(msg.data)
            except msgspec.DecodeError:
                continue  # not ours to judge: forwarded as stored
            last_seq = chunk.seq
            if chunk.is_final:
                return
        await self._nc.publish(reply, error_chunk(
            request_id, ErrorCode.OVERSIZED_FIELD, "the answer has too many chunks to replay",
            seq=last_seq + 1))
