"""`follow_live` past its deadline: chunks already delivered are read before it gives up
(a process frozen past the deadline — SIGSTOP, a long pause — used to report the
timeout with the final chunk waiting in its queue)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from shared.client.answers import Waiting
from shared.client.caller import AnswerTimeoutError, follow_live
from shared.contracts.codec import encode
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
