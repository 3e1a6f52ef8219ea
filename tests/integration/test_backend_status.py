"""A generator whose model backend fails every call shows it in `intentroute status`, on
real servers against a fake OpenAI server in its real wire format: a model the server
does not have (404 on every chat call while the start-up probe of `/models` passes) and
a server answering 500 to everything. The answers meanwhile fall back to the extractive
answerer, as before."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from intentroute.cli import app
from intentroute.stack.nats_users import ops_kwargs
from tests.helpers.fake_openai import FakeOpenAI
from tests.helpers.pipeline import ask_all, base_env, make_request, running

pytestmark = pytest.mark.integration


@pytest.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    server = await FakeOpenAI().start()
    yield server
    await server.stop()


def _status(nats_url: str, *args: str) -> Any:
    ops = ops_kwargs(Path(os.environ["INTENTROUTE_HOME"]))
    return CliRunner().invoke(
        # --timeout: the wait for the replicas' replies (1 s by default; a loaded machine)
        app, ["status", "--interval", "0", "--timeout", "5", *args],
        env={"NATS_URL": nats_url, "NATS_USER": ops["user"], "NATS_PASSWORD": ops["password"],
             "NATS_INBOX_PREFIX": ops["inbox_prefix"], "COLUMNS": "400"})


@pytest.mark.parametrize(("model", "fail_status", "expected"), [
    ("gpt-nope", None, "failing: openai/gpt-nope failed the last 3 calls (refused: HTTP 404"),
    # A 500 is retried once on the same model: two calls a request.
    ("gpt-test", 500,
     "failing: openai/gpt-test failed the last 6 calls (server_error: HTTP 500"),
    ("gpt-test", None, "ok: openai/gpt-test answered the last call"),
], ids=["model-404", "server-500", "ok"])
async def test_status_shows_the_generator_backend_state(
    nc: Any, nats_url: str, database_url: str, kb_index: Path, fake_openai: FakeOpenAI,
    model: str, fail_status: int | None, expected: str,
) -> None:
    fake_openai.fail_status = fail_status
    env = base_env(nats_url, database_url, kb_index, CLASSIFIER_HEADS_DIR="")
    # The model server is the generator's only: the classifier keeps its own layers.
    # Its circuit stays closed (its state would be the line, and the next case's
    # requests would skip the backend): the calls' own outcomes are shown.
    generator_env = {**env, "GENERATOR_BACKEND": "openai", "OPENAI_MODEL": model,
                     "OPENAI_BASE_URL": fake_openai.base_url, "OPENAI_API_KEY": "sk-test",
                     "LLM_CIRCUIT_FAILURES": "1000"}
    async with running(env, ("gateway", "classifier")), \
            running(generator_env, ("generator-conversational",)):
        for i in range(3):
            chunks = await ask_all(nc, make_request(f"say it again {i}",
                                                    query_type="CONVERSATIONAL"))
            final = chunks[-1]
            assert final.is_final
            assert final.error is None
            assert final.answered_by == ("openai/gpt-test" if expected.startswith("ok")
                                         else "extractive")
        as_json = await asyncio.to_thread(_status, nats_url, "--json")
        as_table = await asyncio.to_thread(_status, nats_url)
    assert as_json.exit_code == 0, as_json.output
    rows = {row["stage"]: row for row in json.loads(as_json.stdout)["stages"]}
    line = rows["generator-conversational"]["states"]["backend"]
    assert line.startswith(expected), line
    [replica] = rows["generator-conversational"]["instances"]
    assert replica["states"]["backend"] == line
    if fail_status == 500:  # OpenAI's own error body, cut to one line
        assert "server_error" in line
    # Workers without a model backend report no state.
    assert rows["classifier"]["states"] == {}
    assert as_table.exit_code == 0, as_table.output
    assert f"generator-conversational backend: {expected}" in " ".join(
        as_table.stdout.split())
