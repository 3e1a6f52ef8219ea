"""Generation backends behind one Protocol (`ports.ChatBackend`): Ollama (streaming) and
an OpenAI-compatible chat server (streaming; llama.cpp's server, which `intentroute up
--llm` runs) are the shared model-server clients (`shared.llm`, which Layer 3 and the
relevance judge use too); echo is the benchmarks' own.

A backend's stream yields the answer's text pieces and, at most once and last, the
token counts the model server reported for the call (`TokenCounts`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from shared.llm.ollama import OllamaBackend
from shared.llm.openai import LlamaCppBackend, OpenAIBackend, ProbeFailure
from shared.llm.ports import ChatMessage

__all__ = ["EchoBackend", "LlamaCppBackend", "OllamaBackend", "OpenAIBackend",
           "ProbeFailure"]


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
