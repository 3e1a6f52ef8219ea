"""Ollama through the official async client: answers streamed, labels constrained by
the `format` JSON schema."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from shared.common.deadline import time_left
from shared.llm.choice import Choice
from shared.llm.ports import BackendUnavailableError, ChatMessage, TokenCounts


class OllamaBackend:
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

    async def choose(self, model: str, messages: list[ChatMessage], choice: Choice, *,
                     timeout: float) -> str | None:
        import httpx
        import ollama

        try:
            response = await asyncio.wait_for(self._client.chat(
                model=model,
                messages=[{"role": m.role, "content": m.content} for m in messages],
                format=choice.schema(),
                options={"temperature": 0, "num_predict": 32},
                stream=False,
            ), time_left(timeout))
        except (TimeoutError, httpx.HTTPError, ollama.ResponseError, ConnectionError) as exc:
            raise BackendUnavailableError(f"ollama: {exc!r}") from exc
        return choice.parse(response.message.content or "")
