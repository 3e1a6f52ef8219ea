import pytest

from services.classifier.cascade import Cascade, CascadeConfig
from services.classifier.rules import has_platform_prefix, rules_decide
from shared.contracts.request import AgentRequest
from shared.contracts.routing import Layer, ModelSlot, QueryType


@pytest.mark.parametrize(
    "query",
    [
        "You have a project usage percentage of 20%, provide a recommendation",
        "You have a project usage percentage of 20%. Provide an insight. Rules: Exactly 3 "
        "sentences.",
        "cuántas llamadas llevo este mes?",
        "my invoice for October looks wrong",
        "how many requests do I have left on my plan",
        "tengo el 85% de la cuota consumida, ¿qué hago?",
        "mi factura de este mes es más alta",
        "we reached 95% of our quota",
    ],
)
def test_rc02_platform_data_signals(query: str) -> None:
    assert rules_decide(query) == QueryType.PLATFORM


@pytest.mark.parametrize(
    "query",
    [
        "Write AVAP code that applies a 20% discount to the price",
        "genera un script AVAP que calcule un descuento del 20%",
        "build me a script that flags accounts over 90% of their quota in our db",
    ],
)
def test_code_about_percentages_and_quotas_is_code_not_platform(query: str) -> None:
    assert rules_decide(query) == QueryType.CODE_GENERATION


@pytest.mark.parametrize(
    "query",
    [
        "how do I call the Stripe billing API with RequestPost in AVAP",
        "what is addVar?",
        "explain this",
        "how do I write a loop?",
    ],
)
def test_docs_questions_are_left_to_the_later_layers(query: str) -> None:
    assert rules_decide(query) is None


def test_rc01_prefix_anywhere_case_insensitive() -> None:
    assert has_platform_prefix("SYSTEM: You are a direct and concise assistant. Summarise.")
    assert not has_platform_prefix("you are a helpful assistant")


async def test_cascade_order_declared_then_rules_then_default() -> None:
    cascade = Cascade(CascadeConfig())
    base = {"request_id": "r", "session_id": "s", "agent_id": "platform"}
    declared = await cascade.decide(
        AgentRequest(**base, query="You have 20% usage", query_type="RETRIEVAL"), [],
        trusted=True,
    )
    assert (declared.type, declared.layer) == (QueryType.RETRIEVAL, Layer.DECLARED)
    untrusted = await cascade.decide(
        AgentRequest(request_id="r", session_id="s", agent_id="someone",
                     query="You have a project usage percentage of 20%",
                     query_type="RETRIEVAL"), [], trusted=False,
    )
    assert (untrusted.type, untrusted.layer) == (QueryType.PLATFORM, Layer.RULES)
    assert untrusted.declared_ignored
    assert untrusted.model_slot == ModelSlot.CONVERSATIONAL
    default = await cascade.decide(AgentRequest(**base, query="what is startLoop"), [])
    assert (default.type, default.layer, default.model_slot) == (
        QueryType.RETRIEVAL, Layer.DEFAULT, ModelSlot.MAIN)


@pytest.mark.parametrize(
    "query",
    [
        "this won't compile, can you correct it? addVar(total, 0) addResult(totl)",
        "mi bucle startLoop(i, 0, 10) nunca termina, corrígelo",
        "refactor these RequestPost calls into one helper",
        "optimiza las llamadas a ormDirect de este endpoint",
    ],
)
def test_pasted_code_or_a_named_command_to_change_is_code(query: str) -> None:
    assert rules_decide(query) == QueryType.CODE_GENERATION


@pytest.mark.parametrize(
    "query",
    [
        "why does addVar(x, 1) fail when x is a list?",  # explain, not change
        "what does getRegex(text, pattern, out) return when nothing matches?",
        "rewrite your last answer in bullet points",  # no code object: conversational
        "fix the typo in your previous answer",
    ],
)
def test_questions_about_code_and_rewrites_of_answers_are_not_code_requests(query: str) -> None:
    assert rules_decide(query) is None


@pytest.mark.parametrize(
    "query",
    [
        "Shorten this AVAP snippet, it's way too verbose.",
        "simplifica este código, por favor",
    ],
)
def test_reshaping_code_is_changing_code(query: str) -> None:
    assert rules_decide(query) == QueryType.CODE_GENERATION


def test_outstanding_invoice_question_is_platform() -> None:
    assert rules_decide("por cierto, ¿tengo alguna factura pendiente?") == QueryType.PLATFORM
    assert rules_decide("do I have to pay extra for RequestGet calls?") is None
