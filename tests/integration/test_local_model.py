"""A real model answers through the pipeline: llama.cpp's server (xllamacpp) with
SmolLM2-135M, as `intentroute up --llm` runs it, behind its API key; the generators
stream its answer and log the tokens it reported. A wrong key is refused by the
server, and the answer falls back to the extractive answerer, saying why."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from intentroute.stack import free_port
from intentroute.stack.llm import LOCAL_MODEL, new_api_key, serve, server_env
from tests.helpers.pipeline import ask_all, base_env, make_request, running

pytestmark = pytest.mark.integration

COLUMNS = "outcome, model, answered_by, tokens_in, tokens_out, fallback, fallback_reason"


@pytest.fixture(scope="module")
def local_model() -> Iterator[tuple[int, str]]:
    """The local model server on a free port: (port, API key)."""
    port, key, stop = free_port(), new_api_key(), threading.Event()
    thread = threading.Thread(target=serve, args=(port,),
                              kwargs={"api_key": key, "stop": stop}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            assert thread.is_alive(), "the model server stopped"
            assert time.monotonic() < deadline, "the model server never listened"
            time.sleep(0.1)
    yield port, key
    stop.set()
    thread.join(30)


async def log_row(store: Any, agent_id: str, request_id: str) -> dict[str, Any]:
    row = await store.pool.fetchrow(
        f"SELECT {COLUMNS} FROM request_log WHERE agent_id = $1 AND request_id = $2",
        agent_id, request_id)
    assert row is not None
    return dict(row)


async def test_the_local_model_answers_and_its_tokens_are_logged(
    nc: Any, nats_url: str, database_url: str, kb_index: Path, store: Any,
    local_model: tuple[int, str],
) -> None:
    env = base_env(nats_url, database_url, kb_index, **server_env(*local_model),
                   OLLAMA_MODEL_NAME=LOCAL_MODEL, AVAP_PARSER_TIMEOUT="0")
    req = make_request("How do I loop from 1 to 10 in AVAP?", query_type="RETRIEVAL")
    async with running(env, ("gateway", "classifier", "retriever", "generator-main")):
        chunks = await ask_all(nc, req, timeout=180)
    final = chunks[-1]
    assert final.error is None
    assert final.answered_by == f"local/{LOCAL_MODEL}"
    assert "".join(c.text for c in chunks if c.kind == "text" or c.is_final).strip()
    row = await log_row(store, req.agent_id, req.request_id)
    assert (row["outcome"], row["model"], row["answered_by"], row["fallback"]) == (
        "ok", f"local/{LOCAL_MODEL}", f"local/{LOCAL_MODEL}", False)
    assert row["tokens_in"] > 50  # the system prompt with the retrieved passages
    assert row["tokens_out"] > 0


async def test_a_wrong_key_is_refused_and_the_answer_falls_back(
    nc: Any, nats_url: str, database_url: str, kb_index: Path, store: Any,
    local_model: tuple[int, str],
) -> None:
    port, _ = local_model
    env = base_env(nats_url, database_url, kb_index, **server_env(port, "not-the-key"),
                   OLLAMA_MODEL_NAME=LOCAL_MODEL, AVAP_PARSER_TIMEOUT="0")
    req = make_request("How do I loop from 1 to 10 in AVAP?", query_type="RETRIEVAL")
    async with running(env, ("gateway", "classifier", "retriever", "generator-main")):
        final = (await ask_all(nc, req, timeout=60))[-1]
    assert final.error is None
    assert final.answered_by == "extractive"
    row = await log_row(store, req.agent_id, req.request_id)
    assert (row["fallback"], row["fallback_reason"]) == (True, f"refused local/{LOCAL_MODEL}")
