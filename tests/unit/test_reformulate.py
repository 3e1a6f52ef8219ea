"""Rule-based follow-up resolution and retry reformulation (EN + ES)."""

import pytest

from services.retriever.reformulate import (
    broaden,
    is_followup,
    prf_terms,
    reformulate_with_hint,
    rewrite_followup,
)
from shared.contracts.pipeline import Passage

PREV = ["How do I declare a variable in AVAP?"]


@pytest.mark.parametrize(
    "query",
    [
        "and in a loop?",
        "What about loops?",
        "¿y en un bucle?",
        "Y con una lista?",
        "How do I use it with a list?",
        "Can you show an example of that?",
        "examples?",
        "también con JSON",
    ],
)
def test_followups_are_rewritten_with_previous_context(query: str) -> None:
    assert is_followup(query)
    out = rewrite_followup(query, PREV)
    assert out != query
    assert out.startswith("declare variable AVAP")


def test_rewrite_keeps_new_content_words() -> None:
    assert rewrite_followup("and in a loop?", PREV) == "declare variable AVAP loop"
    assert rewrite_followup("¿y en un bucle?", PREV) == "declare variable AVAP bucle"
    assert rewrite_followup("what about addResult?", PREV) == "declare variable AVAP addResult"


@pytest.mark.parametrize(
    "query",
    [
        "What does addVar do?",
        "¿Cómo hago un bucle en AVAP?",
        "How do I read a request parameter in AVAP?",
        "Is it possible to hash a password with SHA256 in AVAP?",
        "Andrew Ng research",
    ],
)
def test_self_contained_queries_pass_through_unchanged(query: str) -> None:
    assert rewrite_followup(query, PREV) is query


def test_no_history_means_no_rewrite() -> None:
    q = "and in a loop?"
    assert rewrite_followup(q, []) is q
    # The most recent turn with content words is used.
    assert rewrite_followup(q, ["How do I hash?", "ok"]) == "hash loop"
    assert rewrite_followup(q, ["declare variables", "How do I hash?"]) == "hash loop"


def test_broaden_drops_function_words_and_literals_adds_synonyms() -> None:
    assert broaden("¿Cómo hago un bucle en AVAP?") == "bucle AVAP loop startLoop"
    out = broaden('how do I return an error 404 "not found"')
    assert out.split()[:2] == ["return", "error"]
    assert "404" not in out
    assert "found" not in out
    assert "addResult" in out
    assert "exception" in out
    assert broaden("the") == "the"  # nothing left: keep the query


def test_prf_terms_from_top_passages() -> None:
    fb = [
        Passage("a", "", "insulin resistance in obese mice insulin signalling", 1.0),
        Passage("b", "", "obese patients show insulin resistance and inflammation", 0.9),
        Passage("c", "", "unrelated text about glaciers", 0.8),
    ]
    terms = prf_terms("diabetes treatment", fb, n_terms=3)
    assert terms[0] == "insulin"
    assert set(terms) <= {"insulin", "resistance", "obese"}
    assert "glaciers" not in terms  # in one passage only
    out = reformulate_with_hint("diabetes treatment", fb, strategy="prf", n_terms=2)
    assert out.startswith("diabetes treatment ")
    assert "insulin" in out
    assert reformulate_with_hint("diabetes treatment", None) == broaden("diabetes treatment")
    with pytest.raises(ValueError, match="strategy must be"):
        reformulate_with_hint("q", strategy="llm")


def test_follow_up_then_retry_on_the_resolved_query() -> None:
    resolved = rewrite_followup("and in a loop?", PREV)
    assert resolved == "declare variable AVAP loop"
    assert "startLoop" in reformulate_with_hint(resolved, strategy="broaden")
    assert rewrite_followup("What does addVar do?", PREV) == "What does addVar do?"
