"""The relevance judge's model adapter (ADR-0009 Decision 2): the optional LLM check,
instead of the embedding signal, of whether retrieved context answers the query. The
answer is constrained to YES / NO by the model server itself (`shared.llm`: Ollama's
`format`, OpenAI's `response_format`, llama.cpp's grammar). Its port,
`RelevanceJudge`, and the retrieval port are in `services.retriever.ports`."""

from __future__ import annotations

import logging
from functools import cache
from pathlib import Path
from string import Template

from shared.contracts.pipeline import Passage
from shared.llm.choice import Choice
from shared.llm.ports import BackendUnavailableError, ChatMessage, ChoiceBackend
from shared.llm.walk import Walker

log = logging.getLogger("intentroute.retriever")


PROMPT = Path(__file__).resolve().parent / "prompts" / "relevance.txt"
# The answer: {"relevant": "YES"} or {"relevant": "NO"}.
VERDICT = Choice("relevant", ("YES", "NO"))


@cache
def _template() -> Template:
    return Template(PROMPT.read_text(encoding="utf-8"))


def render_relevance_prompt(query: str, passages: list[Passage]) -> list[ChatMessage]:
    context = "\n\n".join(f"[{i}] {p.title}\n{p.text[:800]}" for i, p in enumerate(passages, 1))
    return [ChatMessage("user", _template().substitute(
        query=query, context=context or "(nothing retrieved)"))]


class ModelRelevanceJudge:
    """The judge on its own short chain of fleet models (RELEVANCE_LLM_CHAIN, else
    RELEVANCE_LLM_MODEL on the default backend); None when no verdict could be had
    (the check then does not retry)."""

    def __init__(self, walker: Walker, refs: list[str], *, timeout: float = 5.0) -> None:
        self.walker = walker
        self.refs = refs
        self.timeout = timeout

    @classmethod
    def on(cls, backend: ChoiceBackend, model: str, *,
           timeout: float = 5.0) -> ModelRelevanceJudge:
        """On one client and model (tests, evaluations)."""
        return cls(Walker.single(backend, model), [f"{backend.name}/{model}"], timeout=timeout)

    async def relevant(self, query: str, passages: list[Passage]) -> bool | None:
        try:
            verdict, _ = await self.walker.choose(
                self.refs, render_relevance_prompt(query, passages), VERDICT,
                timeout=self.timeout)
        except BackendUnavailableError as exc:
            log.warning("[retrieve] relevance judge unavailable: %s", exc)
            return None
        return None if verdict is None else verdict == "YES"
