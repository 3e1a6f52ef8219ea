"""Model servers checked at start, and answers that fell back saying why (issue 31): an
Ollama backend is asked at start as the OpenAI-compatible ones are (an unreachable one is
one warning naming its URL and what answers instead, at once); an extractive answer's
label says in one phrase why no model answered."""

from __future__ import annotations

import logging

import pytest

from intentroute.stack import free_port
from services.generator.backends import open_walker, report_probes
from services.generator.extractive import LABEL, with_why
from services.generator.health import FleetHealth
from services.generator.settings import GeneratorSettings
from shared.llm.faults import Fault
from shared.llm.walk import Attempt, Walked, fallback_why
from tests.helpers.fake_ollama import FakeOllama


async def probed_ollama(host: str, *, tries: int = 2) -> tuple[list[str], str]:
    settings = GeneratorSettings.from_env({"OLLAMA_HOST": host, "OLLAMA_MODEL_NAME": "m"})
    walker, model, close = open_walker(settings, None)
    health = FleetHealth([model])
    probes = report_probes(walker, health, tries=tries, pause=0.0)
    try:
        await probes._task
    finally:
        await close()
    return [model], health.state()


async def test_an_unreachable_ollama_is_named_at_start(
        caplog: pytest.LogCaptureFixture) -> None:
    host = f"http://127.0.0.1:{free_port()}"
    with caplog.at_level(logging.WARNING, logger="intentroute.generator"):
        _, state = await probed_ollama(host)
    first = caplog.records[0].getMessage()
    assert "\n" not in first
    assert first.startswith("backend ollama: ")
    assert f"GET {host}/api/version failed" in first
    assert "the extractive answerer by default" in first
    assert state.startswith("failing: ollama/m at start (GET ")


async def test_a_listening_ollama_passes_the_probe(caplog: pytest.LogCaptureFixture) -> None:
    server = await FakeOllama().start()
    try:
        with caplog.at_level(logging.WARNING, logger="intentroute.generator"):
            _, state = await probed_ollama(server.url)
    finally:
        await server.stop()
    assert not caplog.records
    assert state == "ok: ollama/m answered the start-up probe"


def test_a_fallback_says_why_in_one_phrase() -> None:
    walked = Walked()
    assert fallback_why(walked, first=True).startswith("no model server is configured")
    walked.attempts.append(Attempt("ollama/m", Fault.UNREACHABLE,
                                   "http://127.0.0.1:9: connection refused"))
    walked.attempts.append(Attempt("cloud/big", Fault.CIRCUIT_OPEN, "its circuit is open"))
    why = fallback_why(walked, first=False)
    assert why == "ollama/m: http://127.0.0.1:9: connection refused, and 1 more"
    answer = LABEL + "the documentation]\nText."
    assert with_why(answer, why) == (
        "[extractive answer: no language model answered (ollama/m: http://127.0.0.1:9: "
        "connection refused, and 1 more); built from the documentation]\nText.")
    assert with_why("a model's answer", why) == "a model's answer"
