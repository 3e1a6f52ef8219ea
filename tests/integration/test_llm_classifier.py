"""Layer 3 against a fake Ollama server speaking the real /api/chat wire format."""

from __future__ import annotations

import pytest

from services.classifier.cascade import Cascade, CascadeConfig
from services.classifier.llm import LABEL_SCHEMA, OllamaLabeler
from shared.contracts.request import AgentRequest
from shared.contracts.routing import HistoryEntry, Layer, QueryType
from tests.unit.test_cascade import TABLE, FakeLayer2

pytestmark = pytest.mark.integration


async def test_llm_label_is_schema_constrained_and_sees_compact_history(fake_ollama) -> None:
    fake_ollama.responder = lambda body: ['{"type": ', '"CODE_GENERATION"}']
    labeler = OllamaLabeler(fake_ollama.url, "small:0.6b", timeout=5)
    history = [HistoryEntry(QueryType.CODE_GENERATION, "write an endpoint")] * 8
    label = await labeler.label("maybe the loop part", history, "addVar(x, 1)")
    assert label == QueryType.CODE_GENERATION
    sent = fake_ollama.requests[0]
    assert sent["model"] == "small:0.6b"
    assert sent["format"] == LABEL_SCHEMA
    assert sent["stream"] is False
    system = sent["messages"][0]["content"]
    assert system.count('[CODE_GENERATION] "write an endpoint"') == 6  # RC-06
    assert sent["messages"][1]["content"] == "maybe the loop part"


async def test_off_schema_or_unreachable_llm_falls_back_to_layer2(fake_ollama) -> None:
    fake_ollama.responder = lambda body: ["I think it is code"]
    cascade = Cascade(CascadeConfig(), layer2=FakeLayer2(TABLE),
                      llm=OllamaLabeler(fake_ollama.url, "small", timeout=5))
    req = AgentRequest(request_id="r", session_id="s", agent_id="a", query="maybe stuff")
    d = await cascade.decide(req, [])
    assert (d.type, d.layer) == (QueryType.RETRIEVAL, Layer.FALLBACK)
    unreachable = Cascade(CascadeConfig(), layer2=FakeLayer2(TABLE),
                          llm=OllamaLabeler("http://127.0.0.1:9", "small", timeout=1))
    assert (await unreachable.decide(req, [])).layer == Layer.FALLBACK


async def test_rc01_prefixed_query_never_reaches_the_llm(fake_ollama) -> None:
    cascade = Cascade(CascadeConfig(), layer2=FakeLayer2(TABLE),
                      llm=OllamaLabeler(fake_ollama.url, "small", timeout=5))
    req = AgentRequest(request_id="r", session_id="s", agent_id="a",
                       query="You are a direct and concise assistant. Explain hmm")
    d = await cascade.decide(req, [HistoryEntry(QueryType.RETRIEVAL, "x")], trusted=True)
    assert d.type == QueryType.PLATFORM
    assert fake_ollama.requests == []
