"""Reads and writes ask the TURN_ROWS stream about their session only while it holds
anything: an empty queue costs one stream reading per BACKLOG_EVERY, not a request per
read and per write."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from nats.js.errors import NotFoundError

from shared.runtime import row_queue
from shared.runtime.row_queue import AnsweringStore
from testkit.fakes import FakeStore


class FakeJs:
    def __init__(self, messages: int) -> None:
        self.messages = messages
        self.infos = 0
        self.lookups = 0

    async def stream_info(self, name: str) -> Any:
        self.infos += 1
        return SimpleNamespace(state=SimpleNamespace(messages=self.messages))

    async def get_last_msg(self, stream: str, subject: str, direct: bool = False) -> Any:
        self.lookups += 1
        if not self.messages:
            raise NotFoundError
        return SimpleNamespace(data=b"")


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
