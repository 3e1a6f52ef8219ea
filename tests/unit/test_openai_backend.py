"""The generator's OpenAI-compatible backend against a fake OpenAI server in its real
wire format: `OPENAI_BASE_URL` is taken as the OpenAI SDK takes it (`/v1` included,
`/chat/completions` appended), the slots' models come from OPENAI_MODEL*, a base URL
without `/v1` is refused at start with the fix, and a wrong key, a wrong path or a
server that never listens is named at start in one warning line naming the backend,
the URL and the HTTP status."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from intentroute.stack import free_port
from services.generator.backends import Background, open_walker, report_probes
from services.generator.health import FleetHealth
from services.generator.settings import GeneratorSettings
from shared.contracts.routing import ModelSlot
from shared.llm.fleet import FleetError
from shared.llm.openai import OpenAIBackend
from shared.llm.ports import ChatMessage, Ended, Started, StreamEvent, TokenCounts
from shared.llm.walk import Walker
from tests.helpers.fake_openai import FakeOpenAI

MESSAGES = [ChatMessage("system", "Be brief."), ChatMessage("user", "hello?")]


@pytest.fixture
async def fake_openai(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeOpenAI]:
    # The seed fleet's backend reads its key by reference (`env:OPENAI_API_KEY`) from
    # the process environment when its client is made.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    server = await FakeOpenAI().start()
    yield server
    await server.stop()


def settings_for(base_url: str, key: str = "sk-test") -> GeneratorSettings:
    return GeneratorSettings.from_env({"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": key,
                                       "OPENAI_MODEL": "gpt-test"})


async def probed(base_url: str, key: str = "sk-test", *, tries: int = 30,
                 pause: float = 1.0) -> tuple[Walker, FleetHealth]:
    """The generator's start-up probes of the fleet the settings declare, run to the end:
    the walker and the models' health they left."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPENAI_API_KEY", key)
        walker, model, close = open_walker(settings_for(base_url, key), None)
    health = FleetHealth([model])
    probes: Background = report_probes(walker, health, tries=tries, pause=pause)
    try:
        await probes._task  # to its end (the worker stops it at exit instead)
    finally:
        await close()
    return walker, health


@pytest.mark.parametrize("suffix", ["", "/"])
async def test_a_base_url_with_v1_streams_the_answer_and_its_counts(
    fake_openai: FakeOpenAI, suffix: str,
) -> None:
    walker, model, close = open_walker(settings_for(fake_openai.base_url + suffix), None)
    assert model == "openai/gpt-test"
    backend = walker.clients["openai"]
    assert isinstance(backend, OpenAIBackend)
    try:
        got: list[StreamEvent] = [e async for e in backend.stream("gpt-test", MESSAGES)]
    finally:
        await close()
    assert got == [Started(), "Hello", " from", " the", " model", TokenCounts(11, 4),
                   Ended(marked=True, finish_reason="stop")]
    assert fake_openai.seen == [("POST", "/v1/chat/completions")]
    assert fake_openai.bodies[0]["model"] == "gpt-test"
    assert fake_openai.bodies[0]["messages"][-1] == {"role": "user", "content": "hello?"}


async def test_the_probe_passes_with_the_right_key(
    fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="intentroute.generator"):
        _, health = await probed(fake_openai.base_url)
    assert fake_openai.seen == [("GET", "/v1/models")]
    assert not caplog.records
    assert health.state() == "ok: openai/gpt-test answered the start-up probe"


async def test_a_wrong_key_is_named_at_start_with_the_status(
    fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="intentroute.generator"):
        _, health = await probed(fake_openai.base_url, "no-such-key")
    # One line, asked once (a status is an answer: no retry), naming the backend, the
    # URL and the way out.
    assert fake_openai.seen == [("GET", "/v1/models")]
    [record] = caplog.records
    line = record.getMessage()
    assert "\n" not in line
    assert line.startswith("backend openai: ")
    assert f"GET {fake_openai.base_url}/models -> HTTP 401" in line
    assert "invalid_api_key" in line
    assert "its key" in line
    assert health.state().startswith(
        f"failing: openai/gpt-test at start (GET {fake_openai.base_url}/models -> HTTP 401")


async def test_a_base_url_without_v1_is_refused_at_start_with_the_fix(
    fake_openai: FakeOpenAI,
) -> None:
    root = fake_openai.base_url.removesuffix("/v1")
    with pytest.raises(FleetError, match="ends in /v1") as refused:
        open_walker(settings_for(root), None)
    assert f"{root}/v1" in str(refused.value)
    assert fake_openai.seen == []


async def test_a_wrong_path_before_v1_is_named_by_the_404(
    fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture,
) -> None:
    wrong = fake_openai.base_url.replace("/v1", "/openai/v1")
    with caplog.at_level(logging.WARNING, logger="intentroute.generator"):
        await probed(wrong)
    [record] = caplog.records
    assert f"GET {wrong}/models -> HTTP 404" in record.getMessage()
    assert "/v1 included" in record.getMessage()


async def test_a_server_that_never_listens_is_named_after_the_tries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with caplog.at_level(logging.WARNING, logger="intentroute.generator"):
        _, health = await probed(url, "k", tries=2, pause=0.0)
    [record] = caplog.records
    line = record.getMessage()
    assert line.startswith("backend openai: ")
    assert f"GET {url}/models failed" in line
    assert health.state().startswith("failing: openai/gpt-test at start (GET ")


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
