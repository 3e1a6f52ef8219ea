"""A finished turn's rows never hold its answer back, and are never lost.

The stages write a turn's rows (its messages, classify_history entry, request-log row)
before its final chunk, so the next turn of the session reads this one. When Postgres
does not take them within `ROWS_WAIT` (paused, down, unreachable), they are queued on
the bus instead (`intentroute.rows.<agent>.<session>`, stream TURN_ROWS: stored once
acknowledged) and the final chunk goes out; the `row-writer` consumer, which every worker
runs, writes them when Postgres is back. Until then:

* a read on the request path waits for the session's queued rows, then for Postgres,
  `STORE_READ_WAIT` seconds at most in all (shared.common.settings; issue 32), and not
  at all while Postgres is known away (below): no turn reads a session without its
  previous turn, and none waits for a paused database. Past the bound the read raises
  StoreReadTimeoutError and the stage goes on without it: the classifier decides
  without the intent history, a CONVERSATIONAL turn without the previous answer (the
  decision says `history_unavailable`), the retriever rewrites no follow-up. The
  previous answer comes from the session's last queued rows when they hold one (they
  are newer than anything in Postgres), so it needs no database;
* a session's new rows queue behind its queued ones, and the row writer takes one
  message at a time (the consumer's `max_ack_pending` 1), so they land in order;
* after a write (or a read) timed out, the next writes go to the queue at once and the
  next reads give up at once for `PROBE_AFTER` seconds, then one is tried directly
  again: a paused Postgres costs one answer in `PROBE_AFTER` a `ROWS_WAIT` wait, the
  others nothing.

Whether a session has queued rows is asked of the stream (its last message on the
session's subject) only while the stream holds any: its message count is read at most
every `BACKLOG_EVERY` seconds per worker (and known at once when this worker queues).
Asking per read and per write cost a JetStream request each, several per turn:
`bench pipeline` went from 580 to 385 req/s. The price: rows another worker queued are
seen here up to `BACKLOG_EVERY` late (a turn read in that window may miss its previous
turn, which is still written, in order of its own session's queue).

Every row is keyed by its request (ON CONFLICT in shared.store.writer), so a row written
twice (a direct write that timed out but committed later, then its queued copy) is
stored once. Rows the database refuses are dead-lettered by the row writer (`intentroute
dlq list`): the answer is out, the rows kept for an operator.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig
from nats.js.errors import NotFoundError

from shared.contracts import turn_rows as contract
from shared.contracts.ids import is_valid_id
from shared.contracts.routing import HISTORY_WINDOW, HistoryEntry
from shared.runtime.consumer import StageConsumer, StageSpec
from shared.runtime.ports import Delivery
from shared.runtime.signals import Outcome
from shared.store.ports import (
    StoreReadTimeoutError,
    StoreRejectedError,
    StoreUnavailableError,
    TurnStore,
)
from shared.store.rows import HistoryRow, RequestLogRow, Row, TurnRow
from shared.store.writer import UNREACHABLE

log = logging.getLogger("intentroute.rows")

_T = TypeVar("_T")

# Seconds an answer waits for Postgres to take its rows before they are queued. A
# group commit takes 0.2-15 ms here (p99 of `bench pipeline` at 700 req/s), so only a
# database that is away waits this long.
ROWS_WAIT = 0.25
# Seconds after a write timed out during which rows are queued without trying Postgres.
PROBE_AFTER = 1.0
# Seconds between two readings of a session's queue while a read waits for it.
_SETTLE_EVERY = 0.05
# Seconds between two readings of whether TURN_ROWS holds anything (module doc).
BACKLOG_EVERY = 0.2
# Messages the row writer may hold before one is written (1: in the order queued).
_IN_ORDER = 1
# A row writer retrying an unreachable database: deliveries are effectively unbounded
# (the backoff tops out at 2 s: this is weeks), so a long outage loses nothing.
_MAX_DELIVER = 1_000_000


class QueuedRows(msgspec.Struct, frozen=True):
    """The rows of one write, queued for the row writer."""

    history: list[HistoryRow] = []
    turns: list[TurnRow] = []
    logs: list[RequestLogRow] = []

    @classmethod
    def of(cls, rows: tuple[Row, ...]) -> QueuedRows:
        return cls(history=[r for r in rows if isinstance(r, HistoryRow)],
                   turns=[r for r in rows if isinstance(r, TurnRow)],
                   logs=[r for r in rows if isinstance(r, RequestLogRow)])

    def rows(self) -> list[Row]:
        return [*self.history, *self.turns, *self.logs]


def subject_for(agent_id: str, session_id: str) -> str:
    """The queue subject of a session's rows (ids that cannot be a token: `_`)."""
    return contract.rows_subject(agent_id if is_valid_id(agent_id) else contract.NO_ID,
                                 session_id if is_valid_id(session_id) else contract.NO_ID)


class AnsweringStore:
    """The stages' TurnStore: writes that never wait on Postgres for longer than
    `ROWS_WAIT`, reads that see every queued turn of their session (module doc)."""

    def __init__(self, store: TurnStore, js: JetStreamContext, *,
                 wait: float = ROWS_WAIT, probe_after: float = PROBE_AFTER,
                 read_wait: float = ROWS_WAIT) -> None:
        self._store = store
        self._js = js
        self._wait = wait
        self._read_wait = read_wait
        self._probe_after = probe_after
        # Until when (monotonic) rows go to the queue without trying Postgres.
        self._queue_until = 0.0
        # Does TURN_ROWS hold anything, as last read (monotonic time of the reading)?
        self._backlog = True
        self._backlog_at = float("-inf")
        self._reading: asyncio.Task[None] | None = None
        # Until when (monotonic) reads give up at once: a session's queued rows were not
        # written within a read's bound (module doc).
        self._reads_away_until = 0.0
        # Reads given up on, left to end when the database answers.
        self._stuck: set[asyncio.Future[Any]] = set()

    def database_back(self) -> None:
        """Postgres took a write: rows go to it directly again, reads are tried."""
        self._queue_until = 0.0
        self._reads_away_until = 0.0

    async def _read_backlog(self) -> None:
        try:
            info = await self._js.stream_info(contract.STREAM)
            self._backlog = bool(info.state.messages)
        except Exception as exc:  # unknown: ask per session
            log.debug("%s: %r", contract.STREAM, exc)
            self._backlog = True
        self._backlog_at = time.monotonic()

    async def _queue_may_hold_rows(self) -> bool:
        if time.monotonic() - self._backlog_at >= BACKLOG_EVERY:
            if self._reading is None or self._reading.done():
                self._reading = asyncio.ensure_future(self._read_backlog())
            await asyncio.shield(self._reading)
        return self._backlog

    async def _pending(self, agent_id: str, session_id: str) -> bool:
        if not await self._queue_may_hold_rows():
            return False
        try:
            await self._js.get_last_msg(contract.STREAM, subject_for(agent_id, session_id),
                                        direct=True)
        except NotFoundError:
            return False
        return True

    def _database_away(self) -> bool:
        return time.monotonic() < max(self._queue_until, self._reads_away_until)

    def _unread(self, what: str, session_id: str, why: str) -> StoreReadTimeoutError:
        return StoreReadTimeoutError(f"{what} of session {session_id!r} not read: {why}")

    async def _settled(self, agent_id: str, session_id: str, until: float,
                       what: str) -> None:
        """Until the session has no queued rows, `until` (monotonic) at most."""
        while await self._pending(agent_id, session_id):
            if self._database_away():
                raise self._unread(what, session_id, "its rows wait for the database")
            if time.monotonic() + _SETTLE_EVERY > until:
                # Rows not written within the bound: the database is likely away (the
                # rows' writes say so in the worker that queued them, not in this one).
                self._reads_away_until = time.monotonic() + self._probe_after
                raise self._unread(what, session_id, "its rows wait for the database")
            await asyncio.sleep(_SETTLE_EVERY)

    async def _read(self, what: str, agent_id: str, session_id: str,
                    read: Callable[[], Awaitable[_T]]) -> _T:
        """`read` of Postgres once the session is settled, within `read_wait` in all."""
        until = time.monotonic() + self._read_wait
        if self._database_away():
            raise self._unread(what, session_id, "the database is away")
        await self._settled(agent_id, session_id, until, what)
        task = asyncio.ensure_future(read())
        done, _ = await asyncio.wait({task}, timeout=max(until - time.monotonic(), 0.0))
        if task in done:
            try:
                return task.result()
            except (*UNREACHABLE, StoreUnavailableError) as exc:  # down, refusing
                self._queue_until = time.monotonic() + self._probe_after
                raise self._unread(what, session_id, f"the database is away: {exc!r}"
                                   ) from exc
        # Not cancelled: cancelling a query waits for its cancel request, which a paused
        # server never answers (the first `bench pg_pause` run with wait_for: questions
        # asked during the pause stalled 18.6 s). It ends when the server answers.
        self._stuck.add(task)
        task.add_done_callback(self._forget)
        self._queue_until = time.monotonic() + self._probe_after
        log.warning("postgres did not answer a read within %.2fs: %s taken as "
                    "unavailable", self._read_wait, what)
        raise self._unread(what, session_id, "the database did not answer")

    def _forget(self, task: asyncio.Future[Any]) -> None:
        self._stuck.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("a read given up on ended: %r", task.exception())

    async def _last_queued(self, agent_id: str, session_id: str) -> QueuedRows | None:
        """The session's last queued rows (None: none queued)."""
        if not await self._queue_may_hold_rows():
            return None
        try:
            msg = await self._js.get_last_msg(
                contract.STREAM, subject_for(agent_id, session_id), direct=True)
        except NotFoundError:
            return None
        try:
            return msgspec.json.decode(msg.data or b"", type=QueuedRows)
        except msgspec.DecodeError:
            return None

    async def last_history(self, agent_id: str, session_id: str,
                           n: int = HISTORY_WINDOW) -> list[HistoryEntry]:
        return await self._read("the intent history", agent_id, session_id,
                                lambda: self._store.last_history(agent_id, session_id, n))

    async def previous_answer(self, agent_id: str, session_id: str) -> str | None:
        """The session's last answer: from its last queued rows when they hold one
        (written after anything in Postgres), else from Postgres within the bound."""
        queued = await self._last_queued(agent_id, session_id)
        if queued is not None and queued.turns:
            return queued.turns[-1].answer
        return await self._read("the previous answer", agent_id, session_id,
                                lambda: self._store.previous_answer(agent_id, session_id))

    async def last_turns(self, agent_id: str, session_id: str,
                         n: int = 4) -> list[tuple[str, str]]:
        return await self._read("the last turns", agent_id, session_id,
                                lambda: self._store.last_turns(agent_id, session_id, n))

    async def write(self, *rows: Row, deadline: float | None = None) -> None:
        """Rows committed, or queued durably (a session's rows stay in one place: behind
        its queued ones if it has any); StoreRejectedError as the store raises it."""
        sessions: dict[tuple[str, str], list[Row]] = {}
        for row in rows:
            sessions.setdefault((row.agent_id, row.session_id), []).append(row)
        for (agent_id, session_id), group in sessions.items():
            await self._write_session(agent_id, session_id, tuple(group), deadline)

    async def _write_session(self, agent_id: str, session_id: str, rows: tuple[Row, ...],
                             deadline: float | None) -> None:
        if time.monotonic() >= self._queue_until and not await self._pending(
                agent_id, session_id):
            try:
                await asyncio.wait_for(self._store.write(*rows, deadline=deadline),
                                       self._wait)
                return
            except (TimeoutError, StoreUnavailableError) as exc:
                # The write may still commit later; its queued copy is then a no-op.
                self._queue_until = time.monotonic() + self._probe_after
                log.warning("postgres did not take a turn's rows within %.2fs (%r): "
                            "queued on %s", self._wait, exc, contract.STREAM)
        self._backlog = True  # this worker's own rows: seen at once
        payload = msgspec.json.encode(QueuedRows.of(rows))
        ack = await self._js.publish(
            subject_for(agent_id, session_id), payload, stream=contract.STREAM,
            headers={"Nats-Msg-Id": "rows:" + hashlib.blake2b(payload, digest_size=16)
                     .hexdigest()})
        if ack.duplicate:
            log.debug("rows of %s queued already", rows[0].request_id)


class _InOrderSpec(StageSpec, frozen=True, kw_only=True):
    def consumer_config(self) -> ConsumerConfig:
        config = super().consumer_config()
        config.max_ack_pending = _IN_ORDER
        return config


def row_writer_spec(ack_wait: float) -> StageSpec:
    return _InOrderSpec(stream=contract.STREAM, subject=contract.SUBJECTS,
                        durable=contract.DURABLE, max_inflight=_IN_ORDER, ack_wait=ack_wait,
                        max_deliver=_MAX_DELIVER)


def backoff(attempt: int) -> float:
    return float(min(0.2 * 2 ** (attempt - 1), 2.0))


def row_writer(nc: Client, store: TurnStore, answering: AnsweringStore, *,
               ack_wait: float) -> StageConsumer:
    """The consumer that writes queued rows to Postgres: retried with backoff while it
    is unreachable (held meanwhile: a paused server keeps the write waiting), refused
    rows dead-lettered."""

    async def write(delivery: Delivery) -> Outcome:
        try:
            queued = msgspec.json.decode(delivery.data, type=QueuedRows)
        except msgspec.DecodeError as exc:  # only workers publish there: a bug, kept
            await delivery.dead_letter(contract.DURABLE, f"rows do not decode: {exc}")
            return Outcome.DEAD_LETTER
        try:
            await store.write(*queued.rows(), deadline=time.time() + ack_wait)
        except StoreUnavailableError as exc:
            log.warning("queued rows not written yet (delivery %d): %s",
                        delivery.deliveries, exc)
            await delivery.nack(delay=backoff(delivery.deliveries))
            return Outcome.RETRY
        except StoreRejectedError as exc:
            log.error("queued rows refused by the database, dead-lettered: %s", exc)
            await delivery.dead_letter(contract.DURABLE, f"rows refused: {exc}")
            return Outcome.DEAD_LETTER
        answering.database_back()
        return Outcome.OK

    return StageConsumer(nc, row_writer_spec(ack_wait), write)
