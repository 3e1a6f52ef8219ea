"""Prompt templates (files in `prompts/`) rendered by one function."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from string import Template

from shared.contracts.pipeline import Passage, Routed
from shared.contracts.routing import QueryType
from shared.llm.ports import ChatMessage as ChatMessage  # the generator's own vocabulary too

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"

_TEMPLATE_FOR = {
    QueryType.RETRIEVAL: "retrieval",
    QueryType.CODE_GENERATION: "code_generation",
    QueryType.CONVERSATIONAL: "conversational",
    QueryType.PLATFORM: "platform",
}


@cache
def _template(name: str) -> Template:
    return Template((PROMPTS_DIR / f"{name}.txt").read_text(encoding="utf-8"))


def format_passages(passages: list[Passage]) -> str:
    return "\n\n".join(f"[{i}] {p.title}\n{p.text}" for i, p in enumerate(passages, 1))


def render_prompt(env: Routed, *, previous_answer: str = "") -> list[ChatMessage]:
    """System + user messages for the envelope's query type."""
    req = env.request
    editor = (
        _template("editor").substitute(editor_context=req.editor_context)
        if req.editor_context
        else ""
    )
    # The validator sends a rendered `<parser_feedback>` section (RC-08 retry).
    feedback = f"\n{env.parser_feedback}\n" if env.parser_feedback else ""
    system = _template(_TEMPLATE_FOR[env.decision.type]).substitute(
        context=format_passages(env.passages) or "(no documentation retrieved)",
        previous_answer=previous_answer or "(no previous answer in this session)",
        extra_context=req.extra_context or "(no account data provided)",
        user_info=req.user_info or "(none)",
        editor=editor,
        parser_feedback=feedback,
    )
    return [ChatMessage("system", system.strip() + "\n"), ChatMessage("user", req.query)]
