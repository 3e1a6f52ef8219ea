"""Layer 3: small-LLM classifier over Ollama, output constrained to the four labels."""

from __future__ import annotations

import asyncio
import json
import logging
from functools import cache
from pathlib import Path
from string import Template

from shared.common.deadline import time_left
from shared.contracts.routing import HISTORY_WINDOW, HistoryEntry, QueryType

log = logging.getLogger("intentroute.classifier")

PROMPT = Path(__file__).resolve().parent / "prompts" / "classify.txt"
LABEL_SCHEMA = {
    "type": "object",
    "properties": {"type": {"type": "string", "enum": [t.value for t in QueryType]}},
    "required": ["type"],
}


@cache
def _template() -> Template:
    return Template(PROMPT.read_text(encoding="utf-8"))


def format_history(history: list[HistoryEntry]) -> str:
    """The compact intent history: `[TYPE] "topic"`, at most the last 6 (RC-06)."""
    lines = [f'[{h.type.value}] "{h.topic}"' for h in history[-HISTORY_WINDOW:]]
    return "\n".join(lines) or "(no previous turns)"


def render_classifier_prompt(
    query: str, history: list[HistoryEntry], editor_context: str
) -> list[dict[str, str]]:
    editor = (
        f"\n<editor_selection>\n{editor_context[:2000]}\n</editor_selection>\n"
        if editor_context
        else ""
    )
    system = _template().substitute(history=format_history(history), editor=editor)
    return [{"role": "system", "content": system}, {"role": "user", "content": query}]


class OllamaLabeler:
    """Returns None when the model does not answer in time or answers off-schema."""

    def __init__(self, host: str, model: str, *, timeout: float = 3.0) -> None:
        import ollama

        self._client = ollama.AsyncClient(host=host, timeout=timeout)
        self._model = model
        self._timeout = timeout
        self.calls = 0

    async def label(
        self, query: str, history: list[HistoryEntry], editor_context: str
    ) -> QueryType | None:
        import httpx
        import ollama

        self.calls += 1
        try:
            response = await asyncio.wait_for(
                self._client.chat(
                    model=self._model,
                    messages=render_classifier_prompt(query, history, editor_context),
                    format=LABEL_SCHEMA,
                    options={"temperature": 0},
                    stream=False,
                ),
                time_left(self._timeout),
            )
            return QueryType(json.loads(response.message.content or "{}")["type"])
        except (TimeoutError, httpx.HTTPError, ollama.ResponseError, ConnectionError) as exc:
            log.warning("[classify] LLM classifier unavailable: %r", exc)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("[classify] LLM classifier answered off-schema: %r", exc)
        return None
