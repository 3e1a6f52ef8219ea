"""The prompts of the LLM roles that pick a label (Layer 3, the relevance judge) are
snapshot-tested like the generator's, and the constrained answer (`shared.llm.choice`)
reads the same in every server's form: JSON schema, grammar, parsed reply."""

from __future__ import annotations

from services.classifier.layer3 import render_classifier_prompt
from services.retriever.adapters import render_relevance_prompt
from shared.contracts.pipeline import Passage
from shared.contracts.routing import HistoryEntry, QueryType
from shared.llm.choice import Choice
from tests.helpers.snapshots import snapshot


def test_classifier_prompt_snapshot() -> None:
    history = [HistoryEntry(QueryType.RETRIEVAL, f"turn {i}") for i in range(7)] + [
        HistoryEntry(QueryType.CODE_GENERATION, "write an endpoint that hashes")]
    messages = render_classifier_prompt("explain that function", history,
                                        "addParam(password, pwd)\nencodeSHA256(pwd, hash)")
    system = messages[0].content
    assert "turn 1" not in system  # the last 6 (RC-06)
    assert "turn 2" in system
    assert "<platform_priority_rule>" in system  # RC-02
    assert "<history_rule>" in system  # RC-03
    rendered, committed = snapshot("prompt_classify", messages)
    assert rendered == committed


def test_relevance_prompt_snapshot() -> None:
    passages = [Passage("loops#1", "Loops > startLoop", "startLoop(i, 1, 5) counts.", 1.0),
                Passage("vars#1", "Variables > addVar", "addVar(name, value) sets it.", 0.5)]
    messages = render_relevance_prompt("How do I loop from 1 to 10?", passages)
    assert '{"relevant": "YES"}' in messages[0].content
    rendered, committed = snapshot("prompt_relevance", messages)
    assert rendered == committed


def test_a_choice_reads_the_same_in_schema_grammar_and_reply() -> None:
    choice = Choice("type", ("A", "B_C"))
    assert choice.schema() == {
        "type": "object", "properties": {"type": {"type": "string", "enum": ["A", "B_C"]}},
        "required": ["type"], "additionalProperties": False}
    assert choice.grammar() == 'root ::= "{\\"type\\": \\"" ("A" | "B_C") "\\"}"\n'
    assert choice.parse('{"type": "B_C"}') == "B_C"
    assert choice.parse('{"type":"A"  \n\t  ') == "A"  # cut short in trailing whitespace
    for off in ('{"type": "C"}', '{"kind": "A"}', "A", "", '["A"]', '{"type": 1}'):
        assert choice.parse(off) is None, off

