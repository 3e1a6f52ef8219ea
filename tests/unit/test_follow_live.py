"""A caller's answer through hard times: `follow_live` past its deadline reads the chunks
already delivered before it gives up (a process frozen past the deadline — SIGSTOP, a
long pause — used to report the timeout with the final chunk waiting in its queue), and
`ask` publishes again under the same msg id when an ack is lost."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

import nats
import pytest

from shared.client.answers import Waiting
from shared.client.caller import AnswerTimeoutError, ask, follow_live
from shared.contracts.codec import encode
from shared.contracts.request import AgentRequest
from shared.contracts.response import ChunkKind, ResponseChunk

NC: Any = SimpleNamespace(stats={"reconnects": 0})


def _delivered(*chunks: ResponseChunk) -> Waiting:
    waiting = Waiting()
    for chunk in chunks:
        waiting.queue.put_nowait(SimpleNamespace(data=encode(chunk)))  # type: ignore[arg-type]
    return waiting


async def test_chunks_delivered_before_a_late_wake_are_read_to_the_final() -> None:
    source = _delivered(
        ResponseChunk(request_id="r", seq=0, text="Hel", kind=ChunkKind.TEXT),
        ResponseChunk(request_id="r", seq=1, text="lo", kind=ChunkKind.TEXT),
        ResponseChunk(request_id="r", seq=2, kind=ChunkKind.FINAL, is_final=True))
    chunks = [c async for c in follow_live(NC, source, "a", "r", timeout=0.0)]
    assert [(c.seq, c.text, c.is_final) for c in chunks] == [
        (0, "Hel", False), (1, "lo", False), (2, "", True)]


async def test_without_the_final_among_them_it_is_still_a_timeout() -> None:
    source = _delivered(ResponseChunk(request_id="r", seq=0, text="Hel",
                                      kind=ChunkKind.TEXT))
    seen: list[ResponseChunk] = []

    async def follow() -> None:
        async for chunk in follow_live(NC, source, "a", "r", timeout=0.0):
            seen.append(chunk)

    with pytest.raises(AnswerTimeoutError):
        await follow()
    assert [c.text for c in seen] == ["Hel"]


class _FlakyBus:
    """A NATS client whose JetStream acks are lost `lost` times (the request stored or
    not: the stream deduplicates by msg id), then come; its subscription holds a final."""

    stats: ClassVar[dict[str, int]] = {"reconnects": 0}

    def __init__(self, lost: int) -> None:
        self.lost = lost
        self.msg_ids: list[str] = []

    def jetstream(self) -> Any:
        async def publish(subject: str, payload: bytes, **kwargs: Any) -> None:
            self.msg_ids.append(kwargs["headers"]["Nats-Msg-Id"])
            if len(self.msg_ids) <= self.lost:
                raise nats.errors.TimeoutError
        return SimpleNamespace(publish=publish)

    async def subscribe(self, subject: str) -> Any:
        final = ResponseChunk(request_id="r", seq=0, kind=ChunkKind.FINAL, is_final=True)

        async def next_msg(timeout: float) -> Any:
            return SimpleNamespace(data=encode(final))

        async def unsubscribe() -> None:
            pass
        return SimpleNamespace(next_msg=next_msg, unsubscribe=unsubscribe)


async def test_a_lost_ack_is_published_again_under_the_same_msg_id() -> None:
    # A new id per try would store the request twice when a lost ack's publish was
    # stored after all: two runs, two bills.
    bus = _FlakyBus(lost=2)
    req = AgentRequest(request_id="r", agent_id="a", session_id="s", query="q")
    chunks = [c async for c in ask(bus, req)]  # type: ignore[arg-type]
    assert [c.is_final for c in chunks] == [True]
    assert len(bus.msg_ids) == 3
    assert len(set(bus.msg_ids)) == 1
