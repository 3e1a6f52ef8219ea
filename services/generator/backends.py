"""Generation backends behind one Protocol (`ports.ChatBackend`): Ollama (streaming), an
OpenAI-compatible chat server (streaming; llama.cpp's server, which `intentroute up --llm`
runs), echo.

A backend's stream yields the answer's text pieces and, at most once and last, the
token counts the model server reported for the call (`TokenCounts`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import NamedTuple

import msgspec

from services.generator.ports import BackendUnavailableError, TokenCounts
from services.generator.prompts import ChatMessage

log = logging.getLogger("intentroute.generator")


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


class ProbeFailure(NamedTuple):
    """Why a model server would fail: its HTTP status (None: no answer at all)."""

    status: int | None
    reason: str


class OpenAIBackend:
    """An OpenAI-compatible chat server (OpenAI, llama.cpp's, vLLM, ...), streamed as
    server-sent events; the counts come from the final `usage` event.

    `base_url` follows the OpenAI SDK's `OPENAI_BASE_URL`: it is used as given, `/v1`
    included (`https://api.openai.com/v1`), and `/chat/completions` is appended."""

    name = "openai"

    def __init__(self, base_url: str, *, api_key: str = "", timeout: float = 120.0) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # httpx joins a relative path onto the base's path ("http://h/v1" + "models" =
        # "http://h/v1/models").
        self._client = httpx.AsyncClient(base_url=base_url.rstrip("/") + "/",
                                         headers=headers, timeout=timeout)

    async def probe(self, timeout: float = 5.0) -> ProbeFailure | None:
        """Why calls would fail (`GET {base}/models`: a wrong URL or key shows there
        without spending a token), or None when the server answers."""
        import httpx

        url = f"{self._client.base_url}models"
        try:
            response = await self._client.get("models", timeout=timeout)
        except httpx.HTTPError as exc:
            return ProbeFailure(None, f"GET {url} failed: {exc!r}")
        if response.status_code == 200:
            return None
        detail = response.text[:200].replace("\n", " ")
        return ProbeFailure(response.status_code,
                            f"GET {url} -> HTTP {response.status_code}: {detail}")

    async def stream(
        self, model: str, messages: list[ChatMessage]
    ) -> AsyncIterator[str | TokenCounts]:
        import httpx

        body = {"model": model, "stream": True, "stream_options": {"include_usage": True},
                "messages": [{"role": m.role, "content": m.content} for m in messages]}
        try:
            async with self._client.stream("POST", "chat/completions",
                                           json=body) as response:
                if response.status_code != 200:
                    detail = (await response.aread())[:200].decode(errors="replace")
                    raise BackendUnavailableError(
                        f"openai: HTTP {response.status_code}: {detail}")
                async for line in response.aiter_lines():
                    event = _sse_event(line)
                    if event is None:
                        continue
                    for choice in event.choices:
                        if choice.delta.content:
                            yield choice.delta.content
                    if event.usage is not None:
                        yield TokenCounts(event.usage.prompt_tokens,
                                          event.usage.completion_tokens)
        except httpx.HTTPError as exc:
            raise BackendUnavailableError(f"openai: {exc!r}") from exc

    async def aclose(self) -> None:
        await self._client.aclose()


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta = msgspec.field(default_factory=_Delta)


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _ChatEvent(msgspec.Struct):
    choices: list[_Choice] = []
    usage: _Usage | None = None


_EVENT = msgspec.json.Decoder(_ChatEvent)


def _sse_event(line: str) -> _ChatEvent | None:
    """One `data: {...}` line of the stream as an event (None: a keep-alive, a comment,
    `[DONE]`, or a line that is not a chat event)."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return None
    try:
        return _EVENT.decode(data)
    except msgspec.DecodeError:  # not JSON, or JSON of another shape
        log.warning("openai: ignored a stream event that is not a chat chunk: %.200s", data)
        return None


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
