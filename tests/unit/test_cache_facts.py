"""The answer cache's facts (shared.cache.facts) and its matching decision
(shared.cache.match) without vectors: what a similarity score misses is told apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.parser.commands import COMMANDS
from shared.cache.facts import AVAP_COMMANDS, disagreement, facts, language
from shared.cache.match import THRESHOLDS, Verdict, decide, matchable
from shared.contracts.routing import QueryType

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "data" / "avap" / \
    "commands-reference.json"
PAIRS = Path(__file__).resolve().parents[1] / "data" / "cache_pairs.jsonl"


def test_command_list_is_the_parsers_and_the_references() -> None:
    assert set(AVAP_COMMANDS) == set(COMMANDS)
    if REFERENCE.exists():
        names = {c["name"] for c in json.loads(REFERENCE.read_text())["commands"]}
        assert set(AVAP_COMMANDS) == names


@pytest.mark.parametrize(("text", "lang"), [
    ("What does addVar do?", "en"), ("¿Qué hace addVar?", "es"),
    ("Escribe un endpoint que devuelva el id", "es"), ("addVar", "und"),
    ("how do I loop in AVAP", "en"),
])
def test_language_from_function_words_and_marks(text: str, lang: str) -> None:
    assert language(text) == lang


@pytest.mark.parametrize(("a", "b", "check"), [
    ("What does addVar do?", "What does addParam do?", "commands"),
    ("How do I hash with encodeMD5?", "How do I hash with encodeSHA256?", "commands"),
    ("Loop 10 times", "Loop 20 times", "numbers"),
    ("Loop ten times", "Loop 20 times", "numbers"),
    ("Read the `user_id` parameter", "Read the `order_id` parameter", "identifiers"),
    ("Format the date as %Y-%m-%d", "Format the date as %d/%m/%Y", "identifiers"),
    ("Send a GET request to the API", "Send a POST request to the API", "identifiers"),
    ("Call https://a.example.com/users", "Call https://a.example.com/orders", "urls"),
    ("Can I nest loops?", "Can't I nest loops?", "negated"),
    ("¿Puedo anidar bucles?", "¿No puedo anidar bucles?", "negated"),
    ("Return the user id", "Return the user id and name", "terms"),
    ("Convert a list to JSON", "Convert JSON to a list", "directions"),
    ("What does addVar do?", "¿Qué hace addVar?", "lang"),
])
def test_near_duplicates_disagree_on_the_fact_that_differs(a: str, b: str, check: str) -> None:
    assert disagreement(facts(a), facts(b)) == check


@pytest.mark.parametrize(("a", "b"), [
    ("What does addVar do?", "How does addVar work?"),
    ("How do I declare a variable in AVAP?", "How can I define a variable in AVAP?"),
    ("Loop 10 times with startLoop", "Loop ten times using startLoop"),
    ("¿Cómo declaro una variable?", "¿Cómo se declara una variable en AVAP?"),
    ("Write an endpoint that returns the user id", "Create an endpoint that returns the user id"),
    ("Escribe un endpoint que devuelva el id", "Crea un endpoint que retorne el id"),
])
def test_paraphrases_share_their_facts(a: str, b: str) -> None:
    assert disagreement(facts(a), facts(b)) == ""


def test_a_question_with_nothing_to_match_on_never_matches() -> None:
    assert not matchable(facts("how do I do it?"))
    assert decide(facts("how do I do it?"), facts("how do I do it?"), 1.0,
                  QueryType.RETRIEVAL) == Verdict(False, "empty")


def test_decision_needs_the_types_threshold_and_is_off_for_other_types() -> None:
    a, b = facts("What does addVar do?"), facts("How does addVar work?")
    t = THRESHOLDS[QueryType.RETRIEVAL]
    assert decide(a, b, t, QueryType.RETRIEVAL).hit
    assert decide(a, b, t - 0.01, QueryType.RETRIEVAL) == Verdict(False, "similarity")
    assert decide(a, b, 1.0, QueryType.CONVERSATIONAL) == Verdict(False, "type")
    assert decide(a, b, 1.0, QueryType.PLATFORM) == Verdict(False, "type")


def test_the_pair_set_is_large_bilingual_and_well_formed() -> None:
    rows = [json.loads(line) for line in PAIRS.read_text(encoding="utf-8").splitlines()]
    assert len(rows) >= 200
    assert {r["lang"] for r in rows} == {"en", "es"}
    assert {r["type"] for r in rows} == {"RETRIEVAL", "CODE_GENERATION"}
    assert len({r["id"] for r in rows}) == len(rows)
    kinds = {r["kind"] for r in rows if not r["same"]}
    assert {"command_swap", "parameter_change", "negation", "extra_requirement",
            "other_language"} <= kinds
    for r in rows:
        assert set(r) == {"id", "a", "b", "same", "kind", "type", "lang"}
        assert r["same"] == (r["kind"] == "paraphrase")
