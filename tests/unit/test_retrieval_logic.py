"""Relevance check and the single reformulation retry (RC-08), with a fake backend."""

from __future__ import annotations

import math

from services.retriever.logic import RelevancePolicy, retrieve
from shared.contracts.pipeline import Passage
from shared.contracts.routing import QueryType
from testkit.fakes import ScriptedRetrieval

POLICY = RelevancePolicy(mode="embedding", signal="top1_bm25", threshold=5.0)


async def no_turns() -> list[str]:
    return []


async def test_relevant_context_is_used_without_retry() -> None:
    fake = ScriptedRetrieval(bm25_top1=9.0)
    got = await retrieve("what does addVar do", QueryType.RETRIEVAL, fake, k=8, policy=POLICY,
                         last_turns=no_turns)
    assert not got.retried
    assert fake.queries == ["what does addVar do"]


async def test_insufficient_context_retries_exactly_once_then_generates() -> None:
    fake = ScriptedRetrieval(bm25_top1=1.0)  # still insufficient after the retry
    got = await retrieve("what does the frobnicate option of addVar do", QueryType.RETRIEVAL,
                         fake, k=8, policy=POLICY, last_turns=no_turns)
    assert got.retried
    assert len(fake.queries) == 2
    assert fake.queries[1] != fake.queries[0]
    assert got.query == fake.queries[1]
    assert got.passages
    assert got.passages[0].text == f"About {fake.queries[1]}."  # the retry's passages


async def test_code_generation_and_off_policy_never_retry() -> None:
    fake = ScriptedRetrieval(bm25_top1=0.0)
    got = await retrieve("write a loop", QueryType.CODE_GENERATION, fake, k=8, policy=POLICY,
                         last_turns=no_turns)
    off = await retrieve("what is x", QueryType.RETRIEVAL, fake, k=8,
                         policy=RelevancePolicy(mode="off"), last_turns=no_turns)
    assert not got.retried
    assert not off.retried
    assert len(fake.queries) == 2


async def test_follow_up_is_rewritten_from_previous_user_turns() -> None:
    fake = ScriptedRetrieval(bm25_top1=9.0)

    async def turns() -> list[str]:
        return ["how do I declare a variable with addVar?"]

    got = await retrieve("and in a loop?", QueryType.RETRIEVAL, fake, k=8, policy=POLICY,
                         last_turns=turns)
    assert "addVar" in fake.queries[0]
    assert "loop" in fake.queries[0]
    assert got.query == fake.queries[0]


async def test_llm_judge_no_triggers_the_retry_and_none_does_not() -> None:
    class Judge:
        def __init__(self, verdict: bool | None) -> None:
            self.verdict = verdict

        async def relevant(self, query: str, passages: list[Passage]) -> bool | None:
            return self.verdict

    policy = RelevancePolicy(mode="llm")
    no = ScriptedRetrieval(bm25_top1=math.nan)
    got = await retrieve("what is y", QueryType.RETRIEVAL, no, k=8, policy=policy,
                         last_turns=no_turns, judge=Judge(False))
    assert got.retried
    assert len(no.queries) == 2
    unknown = ScriptedRetrieval(bm25_top1=math.nan)
    got = await retrieve("what is y", QueryType.RETRIEVAL, unknown, k=8, policy=policy,
                         last_turns=no_turns, judge=Judge(None))
    assert not got.retried
    assert len(unknown.queries) == 1
