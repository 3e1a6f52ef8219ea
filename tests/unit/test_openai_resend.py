"""A call to an OpenAI-compatible server whose connection is closed before any answer
("Server disconnected without sending a response", as llama.cpp's server did on a
kept-alive connection) is sent once more; a second such close, or one in the middle
of an answer, is the backend's error."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from shared.llm.choice import Choice
from shared.llm.openai import OpenAIBackend
from shared.llm.ports import BackendUnavailableError, ChatMessage, TokenCounts

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


async def collect(backend: OpenAIBackend) -> list[str | TokenCounts]:
    pieces: AsyncIterator[str | TokenCounts] = backend.stream("m", MESSAGES)
    return [piece async for piece in pieces]


async def test_a_dropped_call_is_sent_once_more() -> None:
    server = Dropping(1, COMPLETION)
    async with server as url:
        backend = OpenAIBackend(url)
        assert await backend.choose("m", MESSAGES, LABEL, timeout=5) == "B"
        await backend.aclose()
    assert server.requests == 2
    server = Dropping(1, STREAM)
    async with server as url:
        backend = OpenAIBackend(url)
        assert await collect(backend) == ["Hel", TokenCounts(3, 1)]
        await backend.aclose()
    assert server.requests == 2


async def test_two_drops_in_a_row_are_an_error() -> None:
    for reply in (COMPLETION, STREAM):
        server = Dropping(2, reply)
        async with server as url:
            backend = OpenAIBackend(url)
            call = (backend.choose("m", MESSAGES, LABEL, timeout=5) if reply is COMPLETION
                    else collect(backend))
            with pytest.raises(BackendUnavailableError, match="RemoteProtocolError"):
                await call
            await backend.aclose()
        assert server.requests == 2
