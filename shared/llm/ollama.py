"""Ollama through the official async client: answers streamed, labels constrained by
the `format` JSON schema; failures named as faults (shared.llm.faults)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from shared.common.deadline import time_left
from shared.llm.choice import Choice
from shared.llm.faults import Fault, ModelError, classify_status
from shared.llm.openai import ProbeFailure
from shared.llm.ports import ChatMessage, Ended, Started, StreamEvent, TokenCounts


class OllamaBackend:
    name = "ollama"

    def __init__(self, host: str, *, timeout: float = 120.0, name: str = "") -> None:
        import ollama

        if name:
            self.name = name
        self.host = host
        self._client = ollama.AsyncClient(host=host, timeout=timeout)

    async def probe(self, timeout: float = 5.0) -> ProbeFailure | None:
        """Why calls would fail (`GET {host}/api/version`: a wrong host or port shows at
        start), or None when the server answers."""
        import httpx

        url = f"{self.host.rstrip('/')}/api/version"
        try:
            async with httpx.AsyncClient(timeout=timeout) as http:
                response = await http.get(url)
        except httpx.HTTPError as exc:
            return ProbeFailure(None, f"GET {url} failed: {exc!r}")
        if response.status_code == 200:
            return None
        detail = response.text[:200].replace("\n", " ")
        return ProbeFailure(response.status_code,
                            f"GET {url} -> HTTP {response.status_code}: {detail}")

    def _fault(self, exc: Exception, *, answered: bool) -> ModelError:
        """What an exception of the client or of httpx beneath it is."""
        import httpx
        import ollama

        if isinstance(exc, ollama.ResponseError) and not answered:  # mid-answer: CUT
            return classify_status(exc.status_code, str(exc.error))
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | ConnectionRefusedError):
            return ModelError(Fault.UNREACHABLE, f"{self.host}: {exc!r}")
        return ModelError(Fault.CUT if answered else Fault.RESET, f"{self.host}: {exc!r}")

    async def stream(
        self, model: str, messages: list[ChatMessage], *, prefill: str = ""
    ) -> AsyncIterator[StreamEvent]:
        import httpx
        import ollama

        chat = _messages(messages, prefill)
        answered = False
        try:
            response = await self._client.chat(model=model, messages=chat, stream=True)
            async for part in response:
                if not answered:
                    answered = True
                    yield Started()
                token = part.message.content or ""
                if token:
                    yield token
                if part.done:
                    # The last message of the stream carries the call's counts.
                    yield TokenCounts(part.prompt_eval_count, part.eval_count)
                    yield Ended(marked=True, finish_reason=part.done_reason or "stop")
                    return
            yield Ended(marked=False)
        except (httpx.HTTPError, ollama.ResponseError, ConnectionError) as exc:
            raise self._fault(exc, answered=answered) from exc

    async def choose(self, model: str, messages: list[ChatMessage], choice: Choice, *,
                     timeout: float) -> str | None:
        import httpx
        import ollama

        try:
            response = await asyncio.wait_for(self._client.chat(
                model=model, messages=_messages(messages), format=choice.schema(),
                options={"temperature": 0, "num_predict": 32}, stream=False,
            ), time_left(timeout))
        except TimeoutError as exc:
            raise ModelError(Fault.NO_RESPONSE,
                             f"{self.host}: no answer within {timeout:g}s") from exc
        except (httpx.HTTPError, ollama.ResponseError, ConnectionError) as exc:
            raise self._fault(exc, answered=False) from exc
        return choice.parse(response.message.content or "")


def _messages(messages: list[ChatMessage], prefill: str = "") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": m.role, "content": m.content} for m in messages]
    if prefill:  # Ollama continues a last assistant message rather than answer anew
        out.append({"role": "assistant", "content": prefill})
    return out
