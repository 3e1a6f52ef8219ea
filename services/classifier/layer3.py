"""Layer 3: a small LLM picks one of the four labels, its output constrained to them by
the model server itself (`shared.llm`: Ollama's `format`, OpenAI's `response_format`,
llama.cpp's grammar), from a prompt holding the RC-02 / RC-03 rules and, for a message
that refers to something outside itself, the compact intent history (last 6, RC-06;
prompts/classify.txt)."""

from __future__ import annotations

import logging
from functools import cache
from pathlib import Path
from string import Template

from services.classifier.layer1 import points_elsewhere
from shared.contracts.routing import HISTORY_WINDOW, HistoryEntry, QueryType
from shared.llm.choice import Choice
from shared.llm.ports import BackendUnavailableError, ChatMessage, ChoiceBackend
from shared.llm.walk import Walker

log = logging.getLogger("intentroute.classifier")

PROMPT = Path(__file__).resolve().parent / "prompts" / "classify.txt"
# The answer: {"type": "<one of the four labels>"}.
LABELS = Choice("type", tuple(t.value for t in QueryType))
LABEL_SCHEMA = LABELS.schema()


@cache
def _template() -> Template:
    return Template(PROMPT.read_text(encoding="utf-8"))


def format_history(history: list[HistoryEntry]) -> str:
    """The compact intent history: `[TYPE] "topic"`, at most the last 6 (RC-06)."""
    lines = [f'[{h.type.value}] "{h.topic}"' for h in history[-HISTORY_WINDOW:]]
    return "\n".join(lines) or "(no previous turns)"


def render_classifier_prompt(
    query: str, history: list[HistoryEntry], editor_context: str
) -> list[ChatMessage]:
    editor = (
        f"\n<editor_selection>\n{editor_context[:2000]}\n</editor_selection>\n"
        if editor_context
        else ""
    )
    system = _template().substitute(history=format_history(history), editor=editor)
    return [ChatMessage("system", system), ChatMessage("user", query)]


class ModelLabeler:
    """Layer 3 on its own short chain of fleet models (CLASSIFIER_LLM_CHAIN, else
    CLASSIFIER_LLM_MODEL on the default backend), walked with the fleet's fault handling:
    a model refusing the prompt's length or a content filter is not asked again, an
    open circuit is passed over. Returns None when no model answers in time or one
    answers off-schema (the cascade then falls back to Layer 2's guess)."""

    def __init__(self, walker: Walker, refs: list[str], *, timeout: float = 3.0) -> None:
        self.walker = walker
        self.refs = refs
        self.timeout = timeout

    @classmethod
    def on(cls, backend: ChoiceBackend, model: str, *, timeout: float = 3.0) -> ModelLabeler:
        """On one client and model (tests, evaluations)."""
        return cls(Walker.single(backend, model), [f"{backend.name}/{model}"], timeout=timeout)

    @property
    def model(self) -> str:
        return self.refs[0] if self.refs else ""

    async def warm(self, *, timeout: float = 60.0) -> None:
        """One call outside any request, so the server holds the prompt's fixed part
        (llama.cpp caches it): the first real call then costs what every later one does.
        Cold, that first call took 7.5 s on SmolLM2-135M here (one thread, loaded
        machine) against 0.6 s warm, past the 3 s timeout."""
        try:
            await self.walker.choose(self.refs[:1], render_classifier_prompt("hello", [], ""),
                                     LABELS, timeout=timeout)
        except BackendUnavailableError as exc:
            log.warning("[classify] LLM classifier warm-up failed: %s", exc)

    async def label(
        self, query: str, history: list[HistoryEntry], editor_context: str
    ) -> QueryType | None:
        # RC-03: the history only for a message that points at something outside
        # itself; any other message is labelled from its own words. With the history
        # always in the prompt, SmolLM2-135M changed its label with the history on 3 of
        # the 4 blind-set messages it saw.
        messages = render_classifier_prompt(
            query, history if points_elsewhere(query) else [], editor_context)
        try:
            chosen, _ = await self.walker.choose(self.refs, messages, LABELS,
                                                 timeout=self.timeout)
        except BackendUnavailableError as exc:
            log.warning("[classify] LLM classifier unavailable: %s", exc)
            return None
        if chosen is None:
            log.warning("[classify] LLM classifier answered off-schema")
            return None
        return QueryType(chosen)
