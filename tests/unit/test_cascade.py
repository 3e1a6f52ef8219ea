"""The routing contract (RC-01..RC-06) and PRD-0003 scenarios on the cascade, with
hand-written fakes for Layer 2 and Layer 3 (testkit)."""

from __future__ import annotations

import pytest

from services.classifier.cascade import Cascade, CascadeConfig
from services.classifier.handlers import clarification_text
from services.classifier.layer3 import format_history, render_classifier_prompt
from shared.contracts.request import AgentRequest
from shared.contracts.routing import Clarity, HistoryEntry, Layer, ModelSlot, QueryType
from testkit.fakes import KeywordLayer2, ScriptedLabeler

R, C, V, P = (QueryType.RETRIEVAL, QueryType.CODE_GENERATION, QueryType.CONVERSATIONAL,
              QueryType.PLATFORM)


def req(query: str, **kw: str) -> AgentRequest:
    return AgentRequest(request_id="r", session_id="s", agent_id="a", query=query, **kw)


def cascade(llm: ScriptedLabeler | None = None, **cfg: object) -> Cascade:
    return Cascade(CascadeConfig(**cfg), layer2=KeywordLayer2(), llm=llm)  # type: ignore[arg-type]


async def test_rc01_prefix_is_platform_and_never_calls_a_model() -> None:
    llm = ScriptedLabeler(R)
    c = cascade(llm)
    d = await c.decide(req("You are a direct and concise assistant. Summarise the docs."), [],
                       trusted=True)
    assert (d.type, d.layer) == (P, Layer.RULES)
    assert llm.calls == []
    assert c.layer2.seen == []


async def test_rc01_prefix_from_an_untrusted_agent_is_ordinary_text() -> None:
    c = cascade()
    d = await c.decide(
        req("You are a direct and concise assistant. Explain what addVar does."), [])
    assert (d.type, d.layer) == (R, Layer.EMBEDDING)
    # No layer sees the prefix as a cue (the shipped head learned it as one).
    assert c.layer2.seen == ["Explain what addVar does."]  # type: ignore[union-attr]


async def test_rc02_platform_data_wins_over_history() -> None:
    history = [HistoryEntry(R, "what is addVar")] * 5 + [HistoryEntry(C, "write a loop")]
    d = await cascade(ScriptedLabeler(R)).decide(req("cuántas llamadas llevo este mes?"), history)
    assert (d.type, d.layer) == (P, Layer.RULES)


@pytest.mark.parametrize("dominant", list(QueryType))
async def test_rc03_history_never_changes_a_self_contained_message(dominant: QueryType) -> None:
    history = [HistoryEntry(dominant, "earlier turn")] * 6
    c = cascade(ScriptedLabeler(None))
    for query in ("What does addVar do?", "write a loop that sums a list", "hmm tell me stuff"):
        assert (await c.decide(req(query), history)).type == (await c.decide(req(query), [])).type


async def test_prd_scenario_2_mixed_session_platform_question() -> None:
    history = [HistoryEntry(R, "a"), HistoryEntry(R, "b"), HistoryEntry(C, "c"),
               HistoryEntry(R, "d")]
    d = await cascade().decide(req("cuántas llamadas llevo este mes?"), history)
    assert d.type == P
    assert d.model_slot == ModelSlot.CONVERSATIONAL


async def test_prd_scenario_3_explain_this_in_a_code_session() -> None:
    history = [HistoryEntry(C, "write an endpoint"), HistoryEntry(C, "add a loop")]
    d = await cascade().decide(req("explain this"), history)
    assert (d.type, d.layer, d.resolved_reference) == (C, Layer.RULES, True)
    editor = await cascade().decide(
        req("explícame esto", editor_context="addParam(id, uid)\naddResult(uid)"), [])
    assert editor.type == C


async def test_prd_scenario_4_shorter_after_a_retrieval_answer() -> None:
    d = await cascade().decide(req("en menos palabras"), [HistoryEntry(R, "how do loops work")])
    assert d.type == V
    assert d.model_slot == ModelSlot.CONVERSATIONAL


async def test_follow_up_question_takes_the_type_of_what_it_points_at() -> None:
    history = [HistoryEntry(C, "write an endpoint"), HistoryEntry(V, "make it shorter")]
    d = await cascade().decide(req("and how do I test that?"), history)
    assert d.type == C


async def test_rc06_llm_sees_at_most_six_history_entries() -> None:
    history = [HistoryEntry(R, f"turn {i}") for i in range(9)]
    text = format_history(history)
    assert text.count("\n") == 5
    assert "turn 3" in text
    assert "turn 2" not in text
    prompt = render_classifier_prompt("hmm", history, "")[0].content
    assert "<history_rule>" in prompt
    assert "<platform_priority_rule>" in prompt


async def test_threshold_fall_through_to_llm_and_fallback() -> None:
    llm = ScriptedLabeler(C)
    confident = await cascade(llm).decide(req("What does addVar do?"), [])
    assert (confident.layer, confident.clarity) == (Layer.EMBEDDING, Clarity.CLEAR)
    assert llm.calls == []
    unsure = await cascade(llm).decide(req("maybe something"), [])
    assert (unsure.type, unsure.layer, unsure.clarity) == (C, Layer.LLM,
                                                           Clarity.NEEDS_CONFIRMATION)
    down = await cascade(ScriptedLabeler(None)).decide(req("hmm what"), [])
    assert (down.type, down.layer, down.clarity) == (R, Layer.FALLBACK,
                                                     Clarity.NEEDS_CLARIFICATION)
    no_llm = await cascade(None).decide(req("hmm what"), [])
    assert no_llm.layer == Layer.FALLBACK


async def test_threshold_is_configurable() -> None:
    d = await cascade(ScriptedLabeler(None), threshold=0.6).decide(req("maybe something"), [])
    assert (d.layer, d.clarity) == (Layer.EMBEDDING, Clarity.CLEAR)


async def test_multi_intent_is_detected_and_offers_both_types() -> None:
    d = await cascade().decide(
        req("What does addVar do in AVAP and also show my invoice for this month"), [])
    assert d.clarity == Clarity.MULTI_INTENT
    assert d.type == P
    assert {a.type for a in d.alternatives} == {R, P}
    text = clarification_text(d)
    assert "RETRIEVAL" in text
    assert "PLATFORM" in text


async def test_single_intent_with_and_is_not_multi_intent() -> None:
    d = await cascade().decide(req("write an endpoint that reads the id and returns it"), [])
    assert d.clarity == Clarity.CLEAR
    assert d.type == C


async def test_declared_type_skips_every_layer() -> None:
    llm = ScriptedLabeler(R)
    c = cascade(llm)
    d = await c.decide(req("hmm", query_type="PLATFORM"), [], trusted=True)
    assert (d.type, d.layer) == (P, Layer.DECLARED)
    assert c.layer2.seen == []
    assert llm.calls == []
    assert not d.declared_ignored


async def test_a_type_declared_by_an_untrusted_agent_is_ignored_and_recorded() -> None:
    d = await cascade().decide(req("what does addvar do", query_type="PLATFORM"), [])
    assert (d.type, d.layer) == (R, Layer.EMBEDDING)
    assert d.declared_ignored


@pytest.mark.parametrize(
    "query", ["¿puedes resumir lo anterior?", "rewrite your last answer in bullet points"])
async def test_reshaping_the_answer_is_conversational_whatever_the_history(query: str) -> None:
    d = await cascade().decide(req(query), [HistoryEntry(R, "how does startLoop work")])
    assert (d.type, d.resolved_reference) == (V, True)


async def test_enclitic_spanish_follow_up_points_at_the_code() -> None:
    history = [HistoryEntry(C, "write an endpoint"), HistoryEntry(V, "make it shorter")]
    d = await cascade().decide(req("añádele manejo de errores"), history)
    assert (d.type, d.resolved_reference) == (C, True)


@pytest.mark.parametrize(
    "query",
    ["lol that's exactly what I needed", "Great, thank you so much! That's all for today."],
)
async def test_thanks_and_sign_offs_ignore_a_history_of_another_type(query: str) -> None:
    d = await cascade().decide(req(query), [HistoryEntry(P, "my invoice"), HistoryEntry(C, "loop")])
    assert (d.type, d.resolved_reference) == (V, False)


async def test_thanks_followed_by_a_question_is_not_social() -> None:
    layer2 = KeywordLayer2()
    d = await Cascade(layer2=layer2).decide(  # type: ignore[arg-type]
        req("thanks! and what does addVar return?"), [HistoryEntry(V, "hello")])
    assert d.type == R
    assert layer2.seen


async def test_follow_up_with_injected_account_figures_is_platform() -> None:
    history = [HistoryEntry(V, "hola")]
    figures = "plan=pro usage_pct=91 calls_month=48000"
    d = await cascade().decide(req("¿y ahora qué hago?", extra_context=figures), history)
    assert d.type == P
    code = [HistoryEntry(C, "write an endpoint")]
    still_code = await cascade().decide(req("and how do I test that?", extra_context=figures),
                                        code)
    assert still_code.type == C
