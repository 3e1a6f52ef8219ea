"""Prompt templates are snapshot-tested; the extractive answerer invents nothing."""

from __future__ import annotations

import pytest

from services.generator.extractive import LABEL, extractive_answer
from services.generator.prompts import render_prompt
from shared.contracts.pipeline import Passage, Routed
from shared.contracts.request import AgentRequest
from shared.contracts.routing import Layer, QueryType, RoutingDecision, slot_for
from tests.helpers.snapshots import snapshot


def envelope(qt: QueryType, **req: str) -> Routed:
    fields = {"request_id": "r", "session_id": "s", "agent_id": "a", "query": "How do I loop?"}
    fields.update(req)
    return Routed(
        request=AgentRequest(**fields),
        accepted_at=0.0,
        decision=RoutingDecision(type=qt, layer=Layer.RULES, confidence=1.0,
                                 model_slot=slot_for(qt)),
        passages=[
            Passage("loops#1", "Loops > startLoop",
                    "startLoop(i, 1, 5) counts from 1 to 5 inclusive. Close it with endLoop().\n"
                    "```avap\nstartLoop(i, 1, 3)\n  addResult(i)\nendLoop()\n```", 1.0),
            Passage("vars#1", "Variables > addVar", "addVar(name, value) sets a variable.", 0.5),
        ],
    )


@pytest.mark.parametrize("qt", list(QueryType))
def test_prompt_snapshots(qt: QueryType) -> None:
    env = envelope(qt, extra_context="usage_percentage=20", editor_context="addVar(x, 1)")
    if qt == QueryType.CODE_GENERATION:
        env.parser_feedback = ("<parser_feedback>\nLine 3: unknown command 'getSHA256' — did you "
                               "mean 'encodeSHA256'?\n</parser_feedback>")
    messages = render_prompt(env, previous_answer="Use startLoop and endLoop.")
    rendered, committed = snapshot(f"prompt_{qt.value.lower()}", messages)
    assert rendered == committed


def test_platform_prompt_states_no_invented_account_data() -> None:
    system = render_prompt(envelope(QueryType.PLATFORM, extra_context="plan=pro"))[0].content
    assert "plan=pro" in system
    assert "Never invent" in system


def test_extractive_platform_answer_quotes_extra_context_only() -> None:
    answer = extractive_answer(envelope(QueryType.PLATFORM, query="How is my usage?",
                                        extra_context="usage_percentage=20. plan=starter."))
    assert answer.startswith(LABEL)
    assert "usage_percentage=20" in answer
    empty = extractive_answer(envelope(QueryType.PLATFORM, query="How is my usage?"))
    assert "no account data" in empty
    assert "%" not in empty


def test_extractive_code_answer_returns_a_documented_example() -> None:
    answer = extractive_answer(envelope(QueryType.CODE_GENERATION, query="loop from 1 to 3"))
    assert "```avap\nstartLoop(i, 1, 3)" in answer


def test_extractive_conversational_shortens_previous_answer() -> None:
    previous = "First sentence. Second sentence. Third sentence. Fourth one. Fifth one."
    answer = extractive_answer(envelope(QueryType.CONVERSATIONAL, query="en menos palabras"),
                               previous_answer=previous)
    body = answer.split("]\n", 1)[1]
    assert len(body) < len(previous)
    assert body.split(". ")[0] in previous
    assert "no previous answer" in extractive_answer(
        envelope(QueryType.CONVERSATIONAL, query="again"))


def test_extractive_retrieval_prefers_matching_passage() -> None:
    answer = extractive_answer(envelope(QueryType.RETRIEVAL, query="how does addVar set a value"))
    assert answer.index("addVar") < answer.index("startLoop")
