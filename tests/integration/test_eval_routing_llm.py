"""`eval routing` with Layer 3 on a model server (a fake OpenAI server in its real wire
format, answering PLATFORM to everything): the messages the cascade is unsure of go to
Layer 3 and only those; the report gives their share, Layer 3's accuracy on them
against Layer 2's guess, and its time per call."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from offline.classifier.routing_eval import run_eval_routing
from services.classifier.settings import ClassifierSettings
from tests.helpers.fake_openai import FakeOpenAI

pytestmark = pytest.mark.integration

BLIND = Path(__file__).resolve().parents[1] / "data" / "routing_eval_blind.jsonl"


@pytest.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    server = await FakeOpenAI(pieces=['{"type": "PLATFORM"}']).start()
    yield server
    await server.stop()


async def test_layer3_sees_the_unsure_messages_and_is_scored_on_them(
    fake_openai: FakeOpenAI, tmp_path: Path,
) -> None:
    settings = ClassifierSettings.from_env({
        "OPENAI_BASE_URL": fake_openai.base_url, "OPENAI_API_KEY": "sk-test",
        "OPENAI_MODEL": "gpt-test", "INTENTROUTE_HOME": str(tmp_path)})
    out = tmp_path / "predictions.jsonl"
    report = await asyncio.to_thread(run_eval_routing, BLIND, settings, threshold=0.999,
                                     predictions_out=out)
    layer3 = report["layer3"]
    n = report["n"]
    predictions = [json.loads(line) for line in out.read_text().splitlines()]
    expected = [json.loads(line)["expected"] for line in BLIND.read_text().splitlines()
                if line.strip()]
    by_llm = [i for i, p in enumerate(predictions) if p["layer"] == "llm"]
    assert layer3["reached"] == len(by_llm) > 0  # the server always answers
    assert layer3["asked"] == layer3["answered"] == layer3["reached"]
    assert report["llm_share"] == round(len(by_llm) / n, 4)
    assert report["layer_share"]["llm"] == report["llm_share"]
    assert all(predictions[i]["predicted"] == "PLATFORM" for i in by_llm)
    right = sum(expected[i] == "PLATFORM" for i in by_llm)
    assert layer3["llm_accuracy"] == round(right / len(by_llm), 4)
    assert layer3["layer2_accuracy"] is not None
    assert layer3["p50_ms"] is not None
    # Warmed up once before the first message, then labels with the strict schema.
    first = fake_openai.bodies[0]
    assert first["messages"][-1]["content"] == "hello"
    assert all(body["response_format"]["type"] == "json_schema"
               for body in fake_openai.bodies)
