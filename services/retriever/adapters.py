"""The relevance judge's Ollama adapter (ADR-0009 Decision 2): the optional LLM YES/NO
check, instead of the embedding signal, of whether retrieved context answers the query.
Its port, `RelevanceJudge`, and the retrieval port are in `services.retriever.ports`."""

from __future__ import annotations

import asyncio
import logging
from functools import cache
from pathlib import Path
from string import Template

from shared.common.deadline import time_left
from shared.contracts.pipeline import Passage

log = logging.getLogger("intentroute.retriever")


PROMPT = Path(__file__).resolve().parent / "prompts" / "relevance.txt"


@cache
def _template() -> Template:
    return Template(PROMPT.read_text(encoding="utf-8"))


def render_relevance_prompt(query: str, passages: list[Passage]) -> str:
    context = "\n\n".join(f"[{i}] {p.title}\n{p.text[:800]}" for i, p in enumerate(passages, 1))
    return _template().substitute(query=query, context=context or "(nothing retrieved)")


class OllamaRelevanceJudge:
    def __init__(self, host: str, model: str, *, timeout: float = 5.0) -> None:
        import ollama

        self._client = ollama.AsyncClient(host=host, timeout=timeout)
        self._model = model
        self._timeout = timeout

    async def relevant(self, query: str, passages: list[Passage]) -> bool | None:
        import httpx
        import ollama

        try:
            response = await asyncio.wait_for(self._client.generate(
                model=self._model, prompt=render_relevance_prompt(query, passages),
                options={"temperature": 0}, stream=False), time_left(self._timeout))
        except (TimeoutError, httpx.HTTPError, ollama.ResponseError, ConnectionError) as exc:
            log.warning("[retrieve] relevance judge unavailable: %r", exc)
            return None
        answer = (response.response or "").strip().upper()
        if answer.startswith("YES"):
            return True
        if answer.startswith("NO"):
            return False
        return None
