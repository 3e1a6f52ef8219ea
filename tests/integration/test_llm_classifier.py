"""Layer 3 and the relevance judge on each model backend, against fake servers speaking
the real wire formats (Ollama's /api/chat, OpenAI's /v1/chat/completions): the answer
constrained to the allowed labels by each server's own mechanism (Ollama `format`,
OpenAI `response_format` with a strict JSON schema, llama.cpp's `grammar` field), the
compact intent history in the prompt, an off-schema or missing answer falling back, and
Layer 3's own chain walked past a failing model as its fault allows (the fault
provider)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.classifier.adapters import build_llm
from services.classifier.cascade import Cascade, CascadeConfig
from services.classifier.layer3 import LABEL_SCHEMA, LABELS, ModelLabeler
from services.classifier.settings import ClassifierSettings
from services.retriever.adapters import VERDICT, ModelRelevanceJudge
from services.retriever.bootstrap import build_judge
from services.retriever.settings import RetrieverSettings
from shared.contracts.pipeline import Passage
from shared.contracts.request import AgentRequest
from shared.contracts.routing import HistoryEntry, Layer, QueryType
from shared.llm.fleet import BackendKind, BackendSpec, Fleet, ModelSpec
from shared.llm.ollama import OllamaBackend
from shared.llm.openai import LlamaCppBackend, OpenAIBackend
from shared.llm.select import close_clients
from shared.llm.walk import Walker
from testkit.fakes import KeywordLayer2
from testkit.fault_provider import FaultProvider
from tests.helpers.fake_openai import FakeOpenAI

pytestmark = pytest.mark.integration

PASSAGES = [Passage("loops#1", "Loops", "startLoop(i, 1, 5) counts from 1 to 5.", 1.0)]


@pytest.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    server = await FakeOpenAI().start()
    yield server
    await server.stop()


def schema_of(body: dict[str, Any]) -> dict[str, Any]:
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["strict"] is True
    schema: dict[str, Any] = fmt["json_schema"]["schema"]
    return schema


async def test_ollama_label_is_schema_constrained_and_sees_compact_history(fake_ollama) -> None:
    fake_ollama.responder = lambda body: ['{"type": ', '"CODE_GENERATION"}']
    labeler = ModelLabeler.on(OllamaBackend(fake_ollama.url), "small:0.6b", timeout=5)
    history = [HistoryEntry(QueryType.CODE_GENERATION, "write an endpoint")] * 8
    label = await labeler.label("what about that part?", history, "addVar(x, 1)")
    assert label == QueryType.CODE_GENERATION
    sent = fake_ollama.requests[0]
    assert sent["model"] == "small:0.6b"
    assert sent["format"] == LABEL_SCHEMA
    assert sent["format"]["properties"]["type"]["enum"] == [t.value for t in QueryType]
    assert sent["stream"] is False
    assert sent["options"]["temperature"] == 0
    system = sent["messages"][0]["content"]
    assert system.count('[CODE_GENERATION] "write an endpoint"') == 6  # RC-06
    assert "<platform_priority_rule>" in system  # RC-02
    assert "<history_rule>" in system  # RC-03
    assert sent["messages"][1]["content"] == "what about that part?"
    # RC-03: a message that names its own subject is labelled without the history.
    await labeler.label("maybe the loop part", history, "")
    assert "write an endpoint" not in fake_ollama.requests[1]["messages"][0]["content"]
    assert "(no previous turns)" in fake_ollama.requests[1]["messages"][0]["content"]


async def test_openai_label_is_constrained_by_a_strict_json_schema(
    fake_openai: FakeOpenAI,
) -> None:
    fake_openai.pieces = ['{"type":', ' "PLATFORM"}']
    backend = OpenAIBackend(fake_openai.base_url, api_key="sk-test")
    labeler = ModelLabeler.on(backend, "gpt-test-mini", timeout=5)
    label = await labeler.label("how much of it is left?", [], "")
    await backend.aclose()
    assert label == QueryType.PLATFORM
    [body] = fake_openai.bodies
    assert fake_openai.seen == [("POST", "/v1/chat/completions")]
    assert (body["model"], body["stream"], body["temperature"]) == ("gpt-test-mini", False, 0)
    assert schema_of(body) == LABEL_SCHEMA
    assert LABEL_SCHEMA["additionalProperties"] is False  # strict mode requires it
    assert "grammar" not in body
    assert body["messages"][-1] == {"role": "user", "content": "how much of it is left?"}


async def test_llamacpp_label_is_constrained_by_its_grammar_field(
    fake_openai: FakeOpenAI,
) -> None:
    fake_openai.pieces = ['{"type": "CONVERSATIONAL"}']
    backend = LlamaCppBackend(fake_openai.base_url, api_key="sk-test")
    label = await ModelLabeler.on(backend, "gpt-test", timeout=5).label("shorter", [], "")
    await backend.aclose()
    assert label == QueryType.CONVERSATIONAL
    [body] = fake_openai.bodies
    assert body["grammar"] == LABELS.grammar()
    assert '"CODE_GENERATION"' in body["grammar"]
    assert body["repeat_penalty"] == 1.0
    assert "response_format" not in body


async def test_the_relevance_judge_is_constrained_to_yes_or_no_on_each_backend(
    fake_ollama, fake_openai: FakeOpenAI,
) -> None:
    fake_ollama.responder = lambda body: ['{"relevant": "NO"}']
    ollama = ModelRelevanceJudge.on(OllamaBackend(fake_ollama.url), "small", timeout=5)
    assert await ollama.relevant("how do loops work?", PASSAGES) is False
    assert fake_ollama.requests[0]["format"] == VERDICT.schema()
    assert "startLoop(i, 1, 5)" in fake_ollama.requests[0]["messages"][0]["content"]

    fake_openai.pieces = ['{"relevant": "YES"}']
    for backend in (OpenAIBackend(fake_openai.base_url, api_key="sk-test"),
                    LlamaCppBackend(fake_openai.base_url, api_key="sk-test")):
        judge = ModelRelevanceJudge.on(backend, "gpt-test", timeout=5)
        assert await judge.relevant("how do loops work?", PASSAGES) is True
        await backend.aclose()
    openai_body, llamacpp_body = fake_openai.bodies
    assert schema_of(openai_body) == VERDICT.schema()
    assert llamacpp_body["grammar"] == VERDICT.grammar()


async def test_the_settings_choose_the_backend_and_its_dialect(
    fake_ollama, fake_openai: FakeOpenAI,
) -> None:
    """Ollama when OLLAMA_HOST is set; else the OpenAI-compatible server in the dialect
    OPENAI_SERVER names (backend `local` for llama.cpp's), with the conversational
    slot's model there; each role's chain names it `backend/model`."""
    openai = {"OPENAI_BASE_URL": fake_openai.base_url, "OPENAI_API_KEY": "sk-test",
              "OPENAI_MODEL": "gpt-test", "OPENAI_MODEL_CONVERSATIONAL": "gpt-test-mini"}
    on_ollama = build_llm(ClassifierSettings.from_env(
        {**openai, "OLLAMA_HOST": fake_ollama.url, "OLLAMA_MODEL_NAME": "big"}))
    assert isinstance(on_ollama, ModelLabeler)
    assert on_ollama.refs == ["ollama/big"]
    assert isinstance(on_ollama.walker.clients["ollama"], OllamaBackend)
    plain = build_llm(ClassifierSettings.from_env(openai))
    assert isinstance(plain, ModelLabeler)
    assert plain.refs == ["openai/gpt-test-mini"]
    assert type(plain.walker.clients["openai"]) is OpenAIBackend
    local = build_llm(ClassifierSettings.from_env({**openai, "OPENAI_SERVER": "llamacpp"}))
    assert isinstance(local, ModelLabeler)
    assert local.refs == ["local/gpt-test-mini"]
    assert isinstance(local.walker.clients["local"], LlamaCppBackend)
    assert build_llm(ClassifierSettings.from_env({})) is None
    assert build_llm(ClassifierSettings.from_env({**openai, "CLASSIFIER_LLM_MODEL": ""})) is None
    # Its own chain, across backends, when the settings name one.
    chained = build_llm(ClassifierSettings.from_env(
        {**openai, "OLLAMA_HOST": fake_ollama.url, "OLLAMA_MODEL_NAME": "big",
         "CLASSIFIER_LLM_CHAIN": "openai/gpt-test-mini, ollama/big"}))
    assert isinstance(chained, ModelLabeler)
    assert chained.refs == ["openai/gpt-test-mini", "ollama/big"]
    judge = build_judge(RetrieverSettings.from_env({**openai, "RELEVANCE_CHECK": "llm"}))
    assert isinstance(judge, ModelRelevanceJudge)
    assert judge.refs == ["openai/gpt-test-mini"]
    assert type(judge.walker.clients["openai"]) is OpenAIBackend
    assert build_judge(RetrieverSettings.from_env(openai)) is None  # the embedding check


async def test_off_schema_or_unreachable_llm_falls_back_to_layer2(
    fake_ollama, fake_openai: FakeOpenAI,
) -> None:
    fake_ollama.responder = lambda body: ["I think it is code"]
    fake_openai.pieces = ['{"type": "SOMETHING_ELSE"}']
    req = AgentRequest(request_id="r", session_id="s", agent_id="a", query="maybe stuff")
    for backend in (OllamaBackend(fake_ollama.url),
                    OpenAIBackend(fake_openai.base_url, api_key="sk-test"),
                    OpenAIBackend(fake_openai.base_url, api_key="wrong-key"),
                    OllamaBackend("http://127.0.0.1:9")):
        cascade = Cascade(CascadeConfig(), layer2=KeywordLayer2(),
                          llm=ModelLabeler.on(backend, "gpt-test", timeout=2))
        d = await cascade.decide(req, [])
        assert (d.type, d.layer) == (QueryType.RETRIEVAL, Layer.FALLBACK), backend
    assert len(fake_ollama.requests) == 1
    assert len(fake_openai.bodies) == 1  # the wrong key was refused before its body was read


async def test_rc01_prefixed_query_never_reaches_the_llm(fake_ollama) -> None:
    cascade = Cascade(CascadeConfig(), layer2=KeywordLayer2(),
                      llm=ModelLabeler.on(OllamaBackend(fake_ollama.url), "small", timeout=5))
    req = AgentRequest(request_id="r", session_id="s", agent_id="a",
                       query="You are a direct and concise assistant. Explain hmm")
    d = await cascade.decide(req, [HistoryEntry(QueryType.RETRIEVAL, "x")], trusted=True)
    assert d.type == QueryType.PLATFORM
    assert fake_ollama.requests == []


@pytest.mark.parametrize(("fault", "calls"), [
    ("context-length", 1), ("content-filter", 1), ("silent", 1), ("500", 2), ("reset", 2),
])
async def test_layer3_asks_a_failing_model_as_its_fault_allows_then_the_next(
    fault: str, calls: int,
) -> None:
    """A prompt too long or filtered is not asked again of the same model, a reset
    once more, a silent server not again; the chain's next model labels."""
    async with FaultProvider() as provider:
        fleet = Fleet(backends={name: BackendSpec(
            kind=BackendKind.OPENAI, url=provider.base_url,
            models={fault: ModelSpec(), "ok": ModelSpec()}) for name in ("bad", "good")})
        clients = {name: OpenAIBackend(provider.base_url, name=name)
                   for name in fleet.backends}
        labeler = ModelLabeler(Walker(fleet, clients), [f"bad/{fault}", "good/ok"],
                               timeout=0.5)
        try:
            label = await labeler.label("how much of it is left?", [], "")
        finally:
            await close_clients(clients)
    assert label == QueryType(LABELS.options[0])  # the provider's first allowed label
    assert provider.count(fault) == calls
    assert provider.count("ok") == 1
