"""Reads and writes ask the TURN_ROWS stream about their session only while it holds
anything: an empty queue costs one stream reading per BACKLOG_EVERY, not a request per
read and per write."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from nats.js.errors import NotFoundError

from shared.runtime import row_queue
from shared.runtime.row_queue import AnsweringStore, QueuedRows
from shared.store.ports import StoreReadTimeoutError
from shared.store.rows import HistoryRow, TurnRow
from testkit.fakes import FakeStore


class FakeJs:
    def __init__(self, messages: int, data: bytes = b"") -> None:
        self.messages = messages
        self.data = data
        self.infos = 0
        self.lookups = 0

    async def stream_info(self, name: str) -> Any:
        self.infos += 1
        return SimpleNamespace(state=SimpleNamespace(messages=self.messages))

    async def get_last_msg(self, stream: str, subject: str, direct: bool = False) -> Any:
        self.lookups += 1
        if not self.messages:
            raise NotFoundError
        return SimpleNamespace(data=self.data)


async def test_an_empty_queue_is_read_once_per_interval_and_no_session_is_asked() -> None:
    js = FakeJs(messages=0)
    store = AnsweringStore(FakeStore(), js)  # type: ignore[arg-type]
    for _ in range(50):
        assert await store.last_history("a", "s") == []
    assert js.lookups == 0
    assert js.infos == 1


async def test_a_queue_holding_rows_is_asked_about_the_session(monkeypatch: Any) -> None:
    monkeypatch.setattr(row_queue, "BACKLOG_EVERY", 0.0)
    js = FakeJs(messages=3)
    store = AnsweringStore(FakeStore(), js)  # type: ignore[arg-type]
    assert await store._pending("a", "s")
    assert js.lookups == 1
    js.messages = 0  # drained: the next reading sees it
    assert not await store._pending("a", "s")


class PausedStore(FakeStore):
    """Postgres SIGSTOPped: a read never answers."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def last_history(self, agent_id: str, session_id: str, n: int = 6) -> Any:
        self.reads += 1
        await asyncio.sleep(3600)

    async def previous_answer(self, agent_id: str, session_id: str) -> Any:
        self.reads += 1
        await asyncio.sleep(3600)


async def test_a_read_postgres_does_not_answer_gives_up_at_its_bound_then_at_once() -> None:
    """Issue 32: the first read waits its bound, the next ones (within PROBE_AFTER) not
    at all, and the rows written meanwhile are queued without trying Postgres."""
    paused = PausedStore()
    store = AnsweringStore(paused, FakeJs(messages=0), read_wait=0.1)  # type: ignore[arg-type]
    started = time.monotonic()
    with pytest.raises(StoreReadTimeoutError):
        await store.last_history("a", "s")
    assert 0.09 < time.monotonic() - started < 0.5
    started = time.monotonic()
    with pytest.raises(StoreReadTimeoutError):
        await store.previous_answer("a", "s")
    assert time.monotonic() - started < 0.05
    assert paused.reads == 1
    store.database_back()  # the row writer wrote: Postgres is asked again
    with pytest.raises(StoreReadTimeoutError):
        await store.previous_answer("a", "s")
    assert paused.reads == 2


def queued_turn(answer: str) -> bytes:
    return msgspec.json.encode(QueuedRows(
        history=[HistoryRow("a", "s", "r-1", "RETRIEVAL", "addVar", "rules", 1.0)],
        turns=[TurnRow("a", "s", "r-1", "what is addVar?", answer, "RETRIEVAL")]))


async def test_the_previous_answer_of_a_session_with_queued_rows_is_read_from_them(
    monkeypatch: Any
) -> None:
    monkeypatch.setattr(row_queue, "BACKLOG_EVERY", 0.0)
    paused = PausedStore()
    js = FakeJs(messages=1, data=queued_turn("addVar(name, value) sets a variable."))
    store = AnsweringStore(paused, js, read_wait=0.1)  # type: ignore[arg-type]
    assert await store.previous_answer("a", "s") == "addVar(name, value) sets a variable."
    assert paused.reads == 0
    # Its history waits for the queue to be written, the bound at most.
    started = time.monotonic()
    with pytest.raises(StoreReadTimeoutError):
        await store.last_history("a", "s")
    assert 0.05 < time.monotonic() - started < 0.5
    assert paused.reads == 0


class DownStore(FakeStore):
    """Postgres down: a read is refused at once."""

    async def last_history(self, agent_id: str, session_id: str, n: int = 6) -> Any:
        raise ConnectionRefusedError(111, "Connection refused")


async def test_a_read_the_database_refuses_gives_up_as_one_it_does_not_answer() -> None:
    store = AnsweringStore(DownStore(), FakeJs(messages=0))  # type: ignore[arg-type]
    with pytest.raises(StoreReadTimeoutError):
        await store.last_history("a", "s")
    assert store._database_away()  # the next ones give up at once, writes queue
