"""Generation backends behind one Protocol: Ollama (streaming), extractive, echo."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Protocol

from services.generator.prompts import ChatMessage

log = logging.getLogger("intentroute.generator")


class BackendUnavailableError(Exception):
    """The model server could not be reached or failed before the first token."""


class ChatBackend(Protocol):
    name: str

    def stream(self, model: str, messages: list[ChatMessage]) -> AsyncIterator[str]: ...


class OllamaBackend:
    """Ollama through the official async client, tokens streamed as they come."""

    name = "ollama"

    def __init__(self, host: str, *, timeout: float = 120.0) -> None:
        import ollama

        self._client = ollama.AsyncClient(host=host, timeout=timeout)

    async def stream(self, model: str, messages: list[ChatMessage]) -> AsyncIterator[str]:
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
        except (httpx.HTTPError, ollama.ResponseError, ConnectionError) as exc:
            raise BackendUnavailableError(f"ollama: {exc}") from exc


class EchoBackend:
    """Instant backend for the pipeline benchmark: repeats the query."""

    name = "echo"

    async def stream(self, model: str, messages: list[ChatMessage]) -> AsyncIterator[str]:
        yield messages[-1].content
