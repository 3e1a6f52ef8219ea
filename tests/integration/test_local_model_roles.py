"""Every LLM role on the real local model: llama.cpp's server (xllamacpp) with
SmolLM2-135M, as `up --llm` runs it (`intentroute.stack.llm.local_server`, one thread).
Layer 3 and the relevance judge get a label through the server's grammar; a
CODE_GENERATION answer goes through the real parser service and, when invalid, gets
exactly one trace-guided retry (RC-08)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from intentroute.stack.llm import LOCAL_MODEL, local_server
from services.classifier.adapters import build_llm
from services.classifier.cascade import Cascade, CascadeConfig
from services.classifier.layer3 import ModelLabeler
from services.classifier.settings import ClassifierSettings
from services.retriever.adapters import ModelRelevanceJudge
from services.retriever.bootstrap import build_judge
from services.retriever.settings import RetrieverSettings
from shared.contracts.pipeline import Passage
from shared.contracts.request import AgentRequest
from shared.contracts.response import ChunkKind, ValidationStatus
from shared.contracts.routing import HistoryEntry, Layer, QueryType
from shared.llm.openai import LlamaCppBackend
from testkit.fakes import KeywordLayer2
from tests.helpers.parser import CountingParser
from tests.helpers.pipeline import ask_all, base_env, make_request, running
from tests.helpers.recording_proxy import RecordingProxy

pytestmark = pytest.mark.integration

RETRY_STATUS = "the parser rejected the code; regenerating with its trace"
# Seconds for a label and for a whole code answer (two generations of up to 256 tokens)
# on one thread of a loaded 2-core machine.
LABEL_TIMEOUT = "60"
ANSWER_TIMEOUT = 600.0


@pytest.fixture(scope="module")
def local_env() -> Iterator[dict[str, str]]:
    with local_server(threads=1) as env:
        yield env


async def test_layer3_on_the_local_model_labels_an_ambiguous_message(
    local_env: dict[str, str],
) -> None:
    llm = build_llm(ClassifierSettings.from_env(
        {**local_env, "CLASSIFIER_LLM_TIMEOUT": LABEL_TIMEOUT}))
    assert isinstance(llm, ModelLabeler)
    assert llm.refs == [f"local/{LOCAL_MODEL}"]
    assert isinstance(llm.walker.clients["local"], LlamaCppBackend)
    # Layer 2 (a stand-in here) is unsure of this message: it falls through to Layer 3.
    cascade = Cascade(CascadeConfig(), layer2=KeywordLayer2(), llm=llm)
    request = AgentRequest(request_id="r", session_id="s", agent_id="a",
                           query="could you handle the dates too")
    history = [HistoryEntry(QueryType.CODE_GENERATION, "write an endpoint that stores"),
               HistoryEntry(QueryType.RETRIEVAL, "what does getDateTime do")]
    decision = await cascade.decide(request, history)
    assert decision.layer == Layer.LLM
    assert decision.type in set(QueryType)
    assert decision.confidence == 0.5  # Layer 2's, which the clarity gate reads


async def test_the_relevance_judge_on_the_local_model_gives_a_verdict(
    local_env: dict[str, str],
) -> None:
    judge = build_judge(RetrieverSettings.from_env(
        {**local_env, "RELEVANCE_CHECK": "llm", "RELEVANCE_TIMEOUT": LABEL_TIMEOUT}))
    assert isinstance(judge, ModelRelevanceJudge)
    assert judge.refs == [f"local/{LOCAL_MODEL}"]
    passages = [Passage("loops#1", "Loops > startLoop",
                        "startLoop(i, 1, 10) repeats the block with i from 1 to 10; "
                        "endLoop() closes it.", 1.0)]
    verdict = await judge.relevant("How do I loop from 1 to 10 in AVAP?", passages)
    assert verdict in (True, False)  # None would mean no answer or an off-grammar one


@pytest.mark.timeout(ANSWER_TIMEOUT + 60)
async def test_a_local_model_code_answer_is_parsed_and_retried_once_with_its_trace(
    nc: Any, nats_url: str, database_url: str, kb_index: Any, local_env: dict[str, str],
    parser: tuple[str, CountingParser],
) -> None:
    url, servicer = parser
    proxy = await RecordingProxy(local_env["OPENAI_BASE_URL"]).start()
    env = base_env(nats_url, database_url, kb_index,
                   **{**local_env, "OPENAI_BASE_URL": proxy.base_url},
                   OLLAMA_MODEL_NAME=LOCAL_MODEL, AVAP_PARSER_URL=url,
                   REQUEST_DEADLINE=str(ANSWER_TIMEOUT), OLLAMA_TIMEOUT=str(ANSWER_TIMEOUT))
    req = make_request("Write an AVAP endpoint that returns the sha256 hash of the "
                       "password parameter.", query_type="CODE_GENERATION")
    try:
        async with running(env, ("gateway", "classifier", "retriever", "generator-main",
                                 "validator")):
            chunks = await ask_all(nc, req, timeout=ANSWER_TIMEOUT)
    finally:
        await proxy.stop()
    final = chunks[-1]
    assert final.error is None
    assert final.answered_by == f"local/{LOCAL_MODEL}"
    # The real parser judged the real model's program: valid, or invalid after the retry.
    assert final.validation_status in (ValidationStatus.VALID,
                                       ValidationStatus.INVALID_UNRESOLVED)
    answers = proxy.bodies("chat/completions")
    # The parser judges each answer that holds a program (one with none is invalid
    # without a call: the validator's NO_PROGRAM_FEEDBACK).
    assert servicer.calls <= len(answers)
    assert "<parser_feedback>" not in answers[0]["messages"][0]["content"]
    retries = [c for c in chunks if c.kind == ChunkKind.STATUS and c.text == RETRY_STATUS]
    if len(answers) == 1:  # valid at once: no retry
        assert final.validation_status == ValidationStatus.VALID
        assert servicer.calls == 1
        assert final.retried is False
        assert retries == []
    else:  # RC-08: exactly one retry, its prompt carrying the parser's trace
        assert len(answers) == 2
        assert final.retried is True
        assert len(retries) == 1
        retry_prompt = answers[1]["messages"][0]["content"]
        assert "<parser_feedback>" in retry_prompt
        assert "Line " in retry_prompt
