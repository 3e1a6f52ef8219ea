"""The generator's OpenAI-compatible backend against a fake OpenAI server in its real
wire format: `OPENAI_BASE_URL` is taken as the OpenAI SDK takes it (`/v1` included,
`/chat/completions` appended), the slots' models come from OPENAI_MODEL*, and a wrong
key is named at start in one warning line carrying the HTTP status."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from intentroute.stack import free_port
from services.generator.backends import OpenAIBackend
from services.generator.bootstrap import choose_backend, report_probe
from services.generator.ports import TokenCounts
from services.generator.prompts import ChatMessage
from services.generator.settings import GeneratorSettings
from shared.contracts.routing import ModelSlot
from tests.helpers.fake_openai import FakeOpenAI

MESSAGES = [ChatMessage("system", "Be brief."), ChatMessage("user", "hello?")]


@pytest.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    server = await FakeOpenAI().start()
    yield server
    await server.stop()


async def collect(backend: OpenAIBackend, model: str) -> list[str | TokenCounts]:
    try:
        return [piece async for piece in backend.stream(model, MESSAGES)]
    finally:
        await backend.aclose()


@pytest.mark.parametrize("suffix", ["", "/"])
async def test_a_base_url_with_v1_streams_the_answer_and_its_counts(
    fake_openai: FakeOpenAI, suffix: str,
) -> None:
    settings = GeneratorSettings.from_env({
        "OPENAI_BASE_URL": fake_openai.base_url + suffix, "OPENAI_API_KEY": "sk-test",
        "OPENAI_MODEL": "gpt-test"})
    backend = choose_backend(settings)
    assert isinstance(backend, OpenAIBackend)
    got = await collect(backend, settings.model)
    assert got == ["Hello", " from", " the", " model", TokenCounts(11, 4)]
    assert fake_openai.seen == [("POST", "/v1/chat/completions")]
    assert fake_openai.bodies[0]["model"] == "gpt-test"
    assert fake_openai.bodies[0]["messages"][-1] == {"role": "user", "content": "hello?"}


async def test_the_probe_passes_with_the_right_key(
    fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture,
) -> None:
    backend = OpenAIBackend(fake_openai.base_url, api_key="sk-test")
    with caplog.at_level(logging.WARNING, logger="intentroute.generator"):
        assert await report_probe(backend) is None
    await backend.aclose()
    assert fake_openai.seen == [("GET", "/v1/models")]
    assert not caplog.records


async def test_a_wrong_key_is_named_at_start_with_the_status(
    fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture,
) -> None:
    backend = OpenAIBackend(fake_openai.base_url, api_key="no-such-key")
    with caplog.at_level(logging.WARNING, logger="intentroute.generator"):
        problem = await report_probe(backend)
    await backend.aclose()
    assert problem is not None
    assert problem.status == 401
    # One line, asked once (a status is an answer: no retry), naming the URL and the way out.
    assert fake_openai.seen == [("GET", "/v1/models")]
    [record] = caplog.records
    line = record.getMessage()
    assert "\n" not in line
    assert f"GET {fake_openai.base_url}/models -> HTTP 401" in line
    assert "invalid_api_key" in line
    assert "OPENAI_API_KEY" in line


async def test_a_base_url_without_v1_is_named_by_the_404(
    fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture,
) -> None:
    root = fake_openai.base_url.removesuffix("/v1")
    backend = OpenAIBackend(root, api_key="sk-test")
    with caplog.at_level(logging.WARNING, logger="intentroute.generator"):
        problem = await report_probe(backend)
    await backend.aclose()
    assert problem is not None
    assert problem.status == 404
    assert "/v1 included" in caplog.records[0].getMessage()


async def test_a_server_that_never_listens_is_named_after_the_tries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = OpenAIBackend(f"http://127.0.0.1:{free_port()}/v1", api_key="k")
    with caplog.at_level(logging.WARNING, logger="intentroute.generator"):
        problem = await report_probe(backend, tries=2, pause=0.0)
    await backend.aclose()
    assert problem is not None
    assert problem.status is None
    [record] = caplog.records
    assert "failed" in record.getMessage()


def test_the_openai_models_fall_back_to_the_seed_names() -> None:
    seeds = {"OPENAI_BASE_URL": "http://h/v1", "OLLAMA_MODEL_NAME": "big",
             "OLLAMA_MODEL_NAME_CONVERSATIONAL": "small"}

    def model(slot: ModelSlot, **extra: str) -> str:
        return GeneratorSettings.from_env({**seeds, **extra}, slot=slot).model

    assert model(ModelSlot.MAIN) == "big"
    assert model(ModelSlot.CONVERSATIONAL) == "small"
    assert model(ModelSlot.MAIN, OPENAI_MODEL="gpt-x") == "gpt-x"
    assert model(ModelSlot.CONVERSATIONAL, OPENAI_MODEL="gpt-x") == "gpt-x"
    own = {"OPENAI_MODEL": "gpt-x", "OPENAI_MODEL_CONVERSATIONAL": "gpt-x-mini"}
    assert model(ModelSlot.CONVERSATIONAL, **own) == "gpt-x-mini"
    assert model(ModelSlot.MAIN, **own) == "gpt-x"
    # Ollama chosen: the OpenAI names are not its models.
    assert model(ModelSlot.MAIN, OLLAMA_HOST="http://o:11434", **own) == "big"
