"""Generation backends behind one Protocol: Ollama (streaming), echo.

A backend's stream yields the answer's text pieces and, at most once and last, the
token counts the model server reported for the call (`TokenCounts`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Protocol

import msgspec

from services.generator.prompts import ChatMessage

log = logging.getLogger("intentroute.generator")


class BackendUnavailableError(Exception):
    """The model server could not be reached or failed before the first token."""


class TokenCounts(msgspec.Struct, frozen=True):
    """Tokens of one call as the server counted them (None: it did not say)."""

    prompt: int | None
    completion: int | None


class ChatBackend(Protocol):
    name: str

    def stream(
        self, model: str, messages: list[ChatMessage]
    ) -> AsyncIterator[str | TokenCounts]: ...


class OllamaBackend:
    """Ollama through the official async client, tokens streamed as they come."""

    name = "ollama"

    def __init__(self, host: str, *, timeout: float = 120.0) -> None:
        import ollama

        self._client = ollama.AsyncClient(host=host, timeout=timeout)

    async def stream(
        self, model: str, messages: list[ChatMessage]
    ) -> AsyncIterator[str | TokenCounts]:
        import httpx
        import ollama

        try:
            response = await self._client.chat(
                model=model,
                messages=[{"role": m.role, "content": m.content} for m in messages],
                stream=True,
            )
            async for part in response:
                token = part.message.content or ""
                if token:
                    yield token
                if part.done:
                    # The last message of the stream carries the call's counts.
                    yield TokenCounts(part.prompt_eval_count, part.eval_count)
        except (httpx.HTTPError, ollama.ResponseError, ConnectionError) as exc:
            raise BackendUnavailableError(f"ollama: {exc}") from exc


class EchoBackend:
    """Backend of the benchmarks: repeats the query, at once or (`delay` seconds) in
    four pieces spread over that time, like a model's stream."""

    name = "echo"

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    async def stream(self, model: str, messages: list[ChatMessage]) -> AsyncIterator[str]:
        text = messages[-1].content
        if self.delay <= 0:
            yield text
            return
        step = max(1, len(text) // 4)
        for start in range(0, len(text), step):
            await asyncio.sleep(self.delay / 4)
            yield text[start:start + step]
