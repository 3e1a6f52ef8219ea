"""A call to an OpenAI-compatible server whose connection is closed before any answer
("Server disconnected without sending a response", as llama.cpp's server did on a
kept-alive connection) is sent once more, a label as a streamed answer, by the chain
walker (the client names the drop RESET and resends nothing itself: the two together
sent a label four times); a second such close is the backend's error."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from shared.llm.choice import Choice
from shared.llm.faults import Fault
from shared.llm.openai import OpenAIBackend
from shared.llm.ports import BackendUnavailableError, ChatMessage
from shared.llm.walk import Walked, Walker
from shared.policy.chain import ERROR, Step

MESSAGES = [ChatMessage("user", "hi")]
LABEL = Choice("type", ("A", "B"))


class Dropping:
    """A raw HTTP/1.1 server on loopback that reads each request and closes the first
    `drops` connections without a byte; later ones get `reply`."""

    def __init__(self, drops: int, reply: bytes) -> None:
        self.drops, self.reply, self.requests = drops, reply, 0
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length")), 0)
        await reader.readexactly(length)
        self.requests += 1
        if self.requests <= self.drops:
            writer.close()
            return
        writer.write(self.reply)
        await writer.drain()
        writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


def http(body: bytes, content_type: str) -> bytes:
    return (f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: "
            f"{len(body)}\r\nConnection: close\r\n\r\n").encode() + body


COMPLETION = http(json.dumps({"choices": [{"index": 0, "message": {
    "role": "assistant", "content": '{"type": "B"}'}}]}).encode(), "application/json")
STREAM = http(b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n'
              b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n'
              b"data: [DONE]\n\n", "text/event-stream")


async def walk(backend: OpenAIBackend) -> tuple[Walked, str]:
    """One answer streamed through the chain walker (one model, then an error): what
    the walk says and the text the caller got."""
    parts: list[str] = []

    async def sink(text: str) -> None:
        parts.append(text)

    async def restart() -> None:
        parts.clear()

    walked = await Walker.single(backend, "m").stream_answer(
        [Step("openai/m"), Step(ERROR)], MESSAGES, sink=sink, on_restart=restart,
        extractive=str, accepted_at=time.time())
    return walked, "".join(parts)


async def test_a_dropped_call_is_sent_once_more() -> None:
    server = Dropping(1, COMPLETION)
    async with server as url:
        backend = OpenAIBackend(url)
        assert await Walker.single(backend, "m").choose(
            ["openai/m"], MESSAGES, LABEL, timeout=5) == ("B", "openai/m")
        await backend.aclose()
    assert server.requests == 2
    # A stream's drop before any byte is RESET, which the chain retries once.
    server = Dropping(1, STREAM)
    async with server as url:
        backend = OpenAIBackend(url)
        walked, text = await walk(backend)
        await backend.aclose()
    assert (walked.answered_by, text) == ("openai/m", "Hel")
    assert [a.fault for a in walked.attempts] == [Fault.RESET, None]
    assert (walked.parts[0].tokens_in, walked.parts[0].tokens_out) == (3, 1)
    assert server.requests == 2


async def test_two_drops_in_a_row_are_an_error() -> None:
    server = Dropping(2, COMPLETION)
    async with server as url:
        backend = OpenAIBackend(url)
        with pytest.raises(BackendUnavailableError, match="RemoteProtocolError"):
            await Walker.single(backend, "m").choose(["openai/m"], MESSAGES, LABEL, timeout=5)
        await backend.aclose()
    assert server.requests == 2
    server = Dropping(2, STREAM)
    async with server as url:
        backend = OpenAIBackend(url)
        walked, text = await walk(backend)
        await backend.aclose()
    assert (walked.answered_by, walked.error_code, text) == ("", "BACKEND_UNAVAILABLE", "")
    assert [a.fault for a in walked.attempts] == [Fault.RESET, Fault.RESET]
    assert "RemoteProtocolError" in walked.attempts[-1].detail
    assert server.requests == 2
