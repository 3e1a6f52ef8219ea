"""The extractive answerer's canned replies to social messages and its answers about the
editor's content (issue 21: "hello!" and "explain this" --editor)."""

from __future__ import annotations

import pytest

from services.generator.extractive import LABEL, extractive_answer
from services.generator.social import Social, social_kind, social_reply
from services.validator.extract import extract_avap_code
from shared.contracts.pipeline import Passage, Routed
from shared.contracts.request import AgentRequest
from shared.contracts.routing import Layer, QueryType, RoutingDecision, slot_for

PROGRAM = "addParam(password, plain)\nencodeSHA256(plain, digest)\naddResult(digest)"
DOCS = [
    Passage("ex#0", "Example programs > Sign-up with a hashed password",
            "Hashes a password.\n```\naddParam(email, email)\naddResult(email)\n```", 2.0),
    Passage("crypto#0", "Hashing and random values > encodeSHA256",
            "Signature: `encodeSHA256(SourceVariable, TargetVariable)`\n\n"
            "Computes the SHA-256 digest of a string. It is hex encoded.", 1.0),
]


def routed(qt: QueryType, query: str, *, editor: str = "", resolved: bool = False,
           passages: list[Passage] | None = None) -> Routed:
    return Routed(
        request=AgentRequest(request_id="r", session_id="s", agent_id="a", query=query,
                             editor_context=editor),
        accepted_at=0.0,
        decision=RoutingDecision(type=qt, layer=Layer.RULES, confidence=1.0,
                                 model_slot=slot_for(qt), resolved_reference=resolved),
        passages=DOCS if passages is None else passages,
    )


@pytest.mark.parametrize(("query", "kind", "lang"), [
    ("hello!", Social.GREETING, "en"),
    ("Good morning!!", Social.GREETING, "en"),
    ("hey, how are you?", Social.GREETING, "en"),
    ("hola 👋", Social.GREETING, "es"),
    ("¿qué tal?", Social.GREETING, "es"),
    ("buenas tardes", Social.GREETING, "es"),
    ("thanks!", Social.THANKS, "en"),
    ("hi, thanks a lot", Social.THANKS, "en"),
    ("great, thank you so much!", Social.THANKS, "en"),
    ("gracias por la ayuda", Social.THANKS, "es"),
    ("ok", Social.ACK, "en"),
    ("¡vale!", Social.ACK, "es"),
    ("bye", Social.GOODBYE, "en"),
    ("hasta luego!", Social.GOODBYE, "es"),
])
def test_social_messages_are_recognised_with_their_language(
    query: str, kind: Social, lang: str
) -> None:
    assert social_kind(query) == (kind, lang)


@pytest.mark.parametrize("query", [
    "hello! how do I loop in AVAP?", "thanks, and shorter", "hola, ¿cómo leo un parámetro?",
    "explain this", "en menos palabras", "and", "they", "hi " * 41,
    # Each "bye bye" is one phrase or two: a backtracking match took seconds to fail here.
    "bye bye " * 14 + "x",
])
def test_a_message_that_asks_something_is_not_social(query: str) -> None:
    assert social_kind(query) is None
    assert social_reply(query) is None


def test_a_greeting_is_answered_even_with_a_previous_answer() -> None:
    answer = extractive_answer(routed(QueryType.CONVERSATIONAL, "hola"),
                               previous_answer="Use startLoop(i, 1, 10).")
    assert answer.startswith(LABEL + "a canned reply]\n¡Hola!")
    assert "startLoop" not in answer


def test_explain_this_lists_the_editors_commands_with_their_documentation() -> None:
    answer = extractive_answer(routed(QueryType.CODE_GENERATION, "explain this",
                                      editor=PROGRAM + "\n", resolved=True))
    assert answer.startswith(LABEL + "your editor and the documentation]\n")
    assert "- `addParam` (line 1: `addParam(password, plain)`)\n" in answer
    # The passage's first sentence that is not its signature.
    assert ("- `encodeSHA256` (line 2: `encodeSHA256(plain, digest)`): Computes the SHA-256 "
            "digest of a string.\n") in answer
    assert "Hashes a password" not in answer  # the example's passage is not the answer
    assert extract_avap_code(answer) == PROGRAM


def test_a_declared_type_without_a_resolved_pointer_still_reads_the_editor() -> None:
    answer = extractive_answer(routed(QueryType.CODE_GENERATION,
                                      "what does this code do?", editor=PROGRAM))
    assert extract_avap_code(answer) == PROGRAM


def test_a_request_that_does_not_point_at_the_editor_is_answered_from_the_docs() -> None:
    answer = extractive_answer(routed(QueryType.CODE_GENERATION,
                                      "write an endpoint that hashes a password", editor=PROGRAM))
    assert extract_avap_code(answer) == "addParam(email, email)\naddResult(email)"


def test_prose_in_the_editor_is_summarised_for_retrieval_and_not_taken_as_code() -> None:
    prose = "AVAP runs each request in a sandbox. Variables do not survive the request."
    retrieval = extractive_answer(routed(QueryType.RETRIEVAL, "explain this", editor=prose,
                                         resolved=True))
    assert retrieval == (LABEL + "your editor]\nYour editor holds no AVAP command call. In "
                         "short, it says: " + prose)
    # CODE_GENERATION must hand the validator a program: the documentation's example.
    code = extractive_answer(routed(QueryType.CODE_GENERATION, "explain this", editor=prose,
                                    resolved=True))
    assert extract_avap_code(code) == "addParam(email, email)\naddResult(email)"


def test_the_editors_program_survives_fences_and_many_names() -> None:
    program = "// ```\n" + "\n".join(f"cmd{i}(x)" for i in range(40))
    answer = extractive_answer(routed(QueryType.CODE_GENERATION, "explain this",
                                      editor=program, resolved=True, passages=[]))
    assert extract_avap_code(answer) == program
    assert "- `cmd29` (line 31" in answer
    assert "cmd30` (" not in answer
    assert "- and 10 more" in answer


def test_a_command_is_described_by_a_whole_sentence_of_its_section() -> None:
    # A long section is indexed as overlapping chunks; the later one comes first here.
    later = Passage("vars#1", "Variables and the response > addVar",
                    "or replaces its current value. The value is resolved in this order:\n\n"
                    "1. If it names a variable, its value is copied.", 2.0)
    first = Passage("vars#0", "Variables and the response > addVar",
                    "Signature: `addVar(targetVarName, varValue)`\n\n| a | b |\n|---|---|\n\n"
                    "`addVar` creates a variable or replaces its current value. The value is "
                    "resolved in this or", 1.0)
    answer = extractive_answer(routed(QueryType.CODE_GENERATION, "explain this",
                                      editor="addVar(x, 1)", resolved=True,
                                      passages=[later, first]))
    assert ("- `addVar` (line 1: `addVar(x, 1)`): `addVar` creates a variable or replaces "
            "its current value.\n") in answer
    only_later = extractive_answer(routed(QueryType.CODE_GENERATION, "explain this",
                                          editor="addVar(x, 1)", resolved=True,
                                          passages=[later]))
    assert "- `addVar` (line 1: `addVar(x, 1)`)\n" in only_later
