"""The answer cache's pieces without servers: which answers are offered, the in-memory
index's lookup (scope, key, TTL, facts, threshold), the policy keys, NOTIFY payloads."""

from __future__ import annotations

import time

import msgspec
import numpy as np
import pytest

from shared.cache.answer_index import AnswerIndex
from shared.cache.answerer import answering_fleet, slot_answerer
from shared.cache.entries import CacheEntry
from shared.cache.facts import facts
from shared.cache.listen import parse
from shared.cache.offer import offer_of, refusal
from shared.common.settings import CommonSettings
from shared.contracts.pipeline import PartPlan, Passage, Routed, Usage
from shared.contracts.request import AgentRequest
from shared.contracts.routing import (
    Clarity,
    Layer,
    ModelSlot,
    QueryType,
    RoutingDecision,
    slot_for,
)
from shared.llm.fleet import BackendKind, BackendSpec, Fleet, ModelSpec, Slots
from shared.policy.agent import AgentPolicy, PolicyError, apply_assignment

COMMON = CommonSettings()
# No model server (`make run`): the extractive answerer is every slot's answerer.
NO_SERVER = Fleet()
PASSAGES = [Passage("variables.md", "addVar", "addVar(name, value) declares a variable.", 3.0,
                    "variables.md"),
            Passage("corpus#7", "x", "text", 1.0, "corpus.jsonl#7")]


def routed(query: str = "What does addVar do?", qtype: QueryType = QueryType.RETRIEVAL,
           **request: str) -> Routed:
    decision = RoutingDecision(type=qtype, layer=Layer.EMBEDDING, confidence=0.97,
                               model_slot=slot_for(qtype))
    req = AgentRequest(request_id="r1", session_id="s1", agent_id="a", query=query, **request)
    return Routed(request=req, accepted_at=time.time(), decision=decision,
                  passages=list(PASSAGES), retrieval_query=query)


def test_a_clean_answer_is_offered_with_its_sources_and_an_estimate_of_its_tokens() -> None:
    offer = offer_of(routed(), NO_SERVER, answer="addVar declares.", answered_by="extractive")
    assert offer is not None
    assert offer.sources == ["corpus.jsonl", "variables.md"]
    assert len(offer.versions) == 2
    assert offer.tokens_estimated
    assert offer.tokens > 0
    assert offer.lang == "en"


@pytest.mark.parametrize(("change", "reason"), [
    (lambda e: msgspec.structs.replace(e, decision=msgspec.structs.replace(
        e.decision, type=QueryType.PLATFORM, model_slot=ModelSlot.CONVERSATIONAL)), "type"),
    (lambda e: msgspec.structs.replace(e, decision=msgspec.structs.replace(
        e.decision, type=QueryType.CONVERSATIONAL, model_slot=ModelSlot.CONVERSATIONAL)),
     "type"),
    (lambda e: msgspec.structs.replace(e, degraded=True), "degraded"),
    (lambda e: msgspec.structs.replace(e, request=msgspec.structs.replace(
        e.request, editor_context="addVar(x, 1)")), "context"),
    (lambda e: msgspec.structs.replace(e, request=msgspec.structs.replace(
        e.request, extra_context="plan=pro")), "context"),
    (lambda e: msgspec.structs.replace(e, decision=msgspec.structs.replace(
        e.decision, clarity=Clarity.NEEDS_CONFIRMATION)), "unclear"),
    (lambda e: msgspec.structs.replace(e, decision=msgspec.structs.replace(
        e.decision, resolved_reference=True)), "reference"),
    (lambda e: msgspec.structs.replace(e, usage=Usage(model="m", fallback=True)), "answered"),
    (lambda e: msgspec.structs.replace(e, passages=[]), "no passages"),
    (lambda e: msgspec.structs.replace(e, retrieval_retried=True), "rewrote"),
    (lambda e: msgspec.structs.replace(e, retrieval_query="addVar plus history"), "rewrote"),
    (lambda e: msgspec.structs.replace(e, parts=[PartPlan(text=e.request.query,
                                                          decision=e.decision)] * 2),
     "split message"),
])
def test_what_may_not_be_stored_is_never_offered(change, reason: str) -> None:  # type: ignore[no-untyped-def]
    env = change(routed())
    why = refusal(env, NO_SERVER, answered_by="extractive", answer="an answer")
    assert reason in why
    assert offer_of(env, NO_SERVER, answer="an answer", answered_by="extractive") is None


def test_only_the_slots_own_model_and_only_valid_code_are_offered() -> None:
    with_model = answering_fleet(CommonSettings(ollama_host="http://m:11434", model_main="big"))
    assert slot_answerer(with_model, ModelSlot.MAIN) == "ollama/big"
    assert slot_answerer(answering_fleet(COMMON), ModelSlot.MAIN) == "extractive"
    assert slot_answerer(NO_SERVER, ModelSlot.MAIN) == "extractive"
    # The model failed and the extractive answerer answered: a fallback.
    assert offer_of(routed(), with_model, answer="a", answered_by="extractive") is None
    assert offer_of(routed(), with_model, answer="a", answered_by="extractive:budget") is None
    assert offer_of(routed(), with_model, answer="a", answered_by="ollama/big") is not None
    # The name before fleets (`<backend>:<model>`) is no fleet ref: never equal.
    assert offer_of(routed(), with_model, answer="a", answered_by="ollama:big") is None
    code = routed("Write an endpoint that returns the user id", QueryType.CODE_GENERATION)
    for status in ("INVALID_UNRESOLVED", "PARSER_UNAVAILABLE"):
        assert offer_of(code, NO_SERVER, answer="a", answered_by="extractive",
                        validation_status=status) is None
    assert offer_of(code, NO_SERVER, answer="a", answered_by="extractive",
                    validation_status="") is not None


def test_the_key_is_the_model_the_request_asks_first() -> None:
    """A request naming a model its agent's policy lists is answered by it first (the
    generator's `chosen_model`): that model is the key; one it does not list, the slot's."""
    fleet = Fleet(backends={"ollama": BackendSpec(kind=BackendKind.OLLAMA,
                                                  url="http://m:11434",
                                                  models={"big": ModelSpec(),
                                                          "small": ModelSpec()})},
                  slots=Slots(main="ollama/big"))
    lists = AgentPolicy(models=["ollama/small"])
    assert slot_answerer(fleet, ModelSlot.MAIN, asked="ollama/small",
                         policy=lists) == "ollama/small"
    assert slot_answerer(fleet, ModelSlot.MAIN, asked="ollama/small") == "ollama/big"
    assert slot_answerer(fleet, ModelSlot.MAIN, asked="ollama/other",
                         policy=lists) == "ollama/big"
    # Without a model server a named model changes nothing: the extractive answerer.
    assert slot_answerer(NO_SERVER, ModelSlot.MAIN, asked="ollama/small",
                         policy=lists) == "extractive"
    asked = routed(model="ollama/small")
    assert offer_of(asked, fleet, answer="a", answered_by="ollama/small",
                    policy=lists) is not None
    assert offer_of(asked, fleet, answer="a", answered_by="ollama/big", policy=lists) is None
    # A stage that does not read the policy (the validator) keeps the slot's own only.
    assert offer_of(asked, fleet, answer="a", answered_by="ollama/small") is None
    assert offer_of(asked, fleet, answer="a", answered_by="ollama/big") is not None
    # A fleet that could not be read: nothing is stored, whoever answered.
    assert slot_answerer(None, ModelSlot.MAIN) == ""
    assert offer_of(routed(), None, answer="a", answered_by="") is None
    assert offer_of(routed(), None, answer="a", answered_by="extractive") is None


def entry(entry_id: int, agent: str = "a", query: str = "What does addVar do?", *,
          created: float | None = None, qtype: str = "RETRIEVAL") -> CacheEntry:
    now = time.time() if created is None else created
    return CacheEntry(id=entry_id, agent_id=agent, request_id=f"r{entry_id}", query=query,
                      query_type=qtype, lang=facts(query).lang, model_slot="main",
                      model="extractive", answer=f"answer {entry_id}", created_at=now,
                      expires_at=now + 3600)


def vec(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def lookup(index: AnswerIndex, query: str, vector: np.ndarray, scope: list[str],
           max_age: float = 3600.0, qtype: QueryType = QueryType.RETRIEVAL):  # type: ignore[no-untyped-def]
    return index.lookup(scope, query_type=qtype, lang=facts(query).lang, model_slot="main",
                        model="extractive", vector=vector, question=facts(query),
                        now=time.time(), max_age_s=lambda _owner: max_age)


def test_the_index_serves_only_entries_in_scope_with_agreeing_facts_within_the_ttl() -> None:
    index = AnswerIndex()
    index.add(entry(1), vec(1, 0, 0))
    index.add(entry(2, "b"), vec(1, 0, 0))
    index.add(entry(3, query="What does addParam do?"), vec(0.99, 0.1, 0))
    hit = lookup(index, "How does addVar work?", vec(0.95, 0.1, 0), ["a"])
    assert hit is not None
    assert hit.entry.id == 1
    # Another agent's entry only when the scope says so; a near-duplicate never.
    assert lookup(index, "How does addVar work?", vec(1, 0, 0), ["c"]) is None
    assert lookup(index, "What does addResult do?", vec(1, 0, 0), ["a", "b"]) is None
    # Below the type's threshold, and past the TTL, nothing.
    assert lookup(index, "How does addVar work?", vec(0, 1, 0), ["a"]) is None
    old = AnswerIndex()
    old.add(entry(4, created=time.time() - 100), vec(1, 0, 0))
    assert lookup(old, "How does addVar work?", vec(1, 0, 0), ["a"], max_age=50) is None
    # Another type is another bucket.
    assert lookup(index, "How does addVar work?", vec(1, 0, 0), ["a"],
                  qtype=QueryType.CODE_GENERATION) is None


def test_the_index_forgets_what_is_removed() -> None:
    index = AnswerIndex()
    index.add(entry(1), vec(1, 0, 0))
    index.add(entry(2), vec(1, 0, 0))
    assert index.remove(1) is not None
    assert index.remove(1) is None
    hit = lookup(index, "How does addVar work?", vec(1, 0, 0), ["a"])
    assert hit is not None
    assert hit.entry.id == 2
    index.remove(2)
    assert not index.holds("a")
    assert len(index) == 0


def test_policy_keys_of_the_cache() -> None:
    policy = AgentPolicy()
    for assignment in ("cache=on", "cache_ttl=2h", "cache_group=docs.team-1"):
        policy = apply_assignment(policy, assignment)
    assert (policy.cache, policy.cache_ttl, policy.cache_group) == (True, 7200.0, "docs.team-1")
    assert apply_assignment(policy, "cache=off").cache is False
    assert apply_assignment(policy, "cache_group=").cache_group is None
    assert apply_assignment(policy, "cache_ttl=90").cache_ttl == 90.0
    for bad in ("cache=maybe", "cache_ttl=0", "cache_ttl=400d", "cache_ttl=soon",
                "cache_group=no spaces", "cache_group=" + "x" * 65):
        with pytest.raises(PolicyError):
            apply_assignment(policy, bad)


def test_notifications_name_an_entry_added_or_removed() -> None:
    assert parse("+12") == (True, 12)
    assert parse("-7") == (False, 7)
    assert parse("12") is None
    assert parse("+x") is None
    assert parse("") is None
