"""The request log's accounting (ADR-0006) through the five workers on real NATS and
Postgres, with a fake Ollama that reports token counts as Ollama does: streamed and
validated (collected, non-streamed) answers are counted alike, extractive answers have
zero tokens with a note, fallbacks say why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shared.contracts.request import AgentRequest
from shared.contracts.response import ChunkKind
from tests.helpers.pipeline import ask_all, base_env, make_request, running

pytestmark = pytest.mark.integration

COLUMNS = ("outcome, model, answered_by, tokens_in, tokens_out, tokens_note, first_chunk_ms, "
           "compute_ms, total_ms, fallback, fallback_reason, validation_status")
CODE = ["```avap\n", "addVar(total, 0)\n", "addResult(total)\n", "```\n"]


def responder(body: dict[str, Any]) -> list[str]:
    if "endpoint" in body["messages"][-1]["content"]:
        return CODE
    return ["Use ", "startLoop ", "to ", "count ", "from ", "1 ", "to ", "10."]


def requests() -> dict[str, AgentRequest]:
    return {
        "streamed": make_request("how do I count from 1 to 10?", query_type="RETRIEVAL"),
        "validated": make_request("write an endpoint that returns a total",
                                  query_type="CODE_GENERATION"),
    }


async def log_row(store: Any, req: AgentRequest) -> dict[str, Any]:
    row = await store.pool.fetchrow(
        f"SELECT {COLUMNS} FROM request_log WHERE agent_id = $1 AND request_id = $2",
        req.agent_id, req.request_id)
    assert row is not None
    return dict(row)


async def test_streamed_and_validated_answers_are_counted_as_the_backend_reported(
    nc: Any, nats_url: str, database_url: str, kb_index: Path, fake_ollama: Any, store: Any
) -> None:
    fake_ollama.responder = responder
    fake_ollama.token_delay = 0.05
    env = base_env(nats_url, database_url, kb_index, OLLAMA_HOST=fake_ollama.url,
                   OLLAMA_MODEL_NAME="big:1.7b", AVAP_PARSER_TIMEOUT="0")
    rows, reported, finals, resets = {}, {}, {}, {}
    async with running(env):
        for kind, req in requests().items():
            calls = len(fake_ollama.reported)
            finals[kind] = (await ask_all(nc, req))[-1]
            # One model call per answer: what it reported is what the row must hold.
            (reported[kind],) = fake_ollama.reported[calls:]
            rows[kind] = await log_row(store, req)
        # The model fails in the middle of its answers: the default chain falls back
        # to the extractive answerer (a streamed answer is restarted first).
        fake_ollama.fail_after = {"big:1.7b": 3}
        for kind, req in requests().items():
            chunks = await ask_all(nc, req)
            finals[f"fallback {kind}"] = chunks[-1]
            resets[kind] = sum(c.kind == ChunkKind.RESET for c in chunks)
            rows[f"fallback {kind}"] = await log_row(store, req)

    for kind in ("streamed", "validated"):
        row, (model, prompt_tokens, answer_tokens) = rows[kind], reported[kind]
        assert finals[kind].error is None
        assert finals[kind].answered_by == "ollama/big:1.7b"
        assert (row["outcome"], row["model"], row["answered_by"]) == (
            "ok", "ollama/big:1.7b", "ollama/big:1.7b")
        assert model == "big:1.7b"
        assert (row["tokens_in"], row["tokens_out"], row["tokens_note"]) == (
            prompt_tokens, answer_tokens, "")
        assert prompt_tokens > 50  # the system prompt with the retrieved passages
        assert (row["fallback"], row["fallback_reason"]) == (False, "")
        assert 0 < row["first_chunk_ms"] <= row["total_ms"]
        # Generation took at least the pieces' spacing (0.05 s each).
        assert row["compute_ms"] >= 0.05 * (answer_tokens - 1) * 1000
    assert rows["streamed"]["tokens_out"] == 8
    assert rows["validated"]["tokens_out"] == len(CODE)
    # Streamed: the first piece went out while the model was still writing; validated
    # code is released in one piece after validation (RC-07).
    streamed, validated = rows["streamed"], rows["validated"]
    assert streamed["first_chunk_ms"] < streamed["total_ms"] - 0.05 * 4 * 1000
    assert validated["first_chunk_ms"] > validated["total_ms"] - 100

    for kind in ("fallback streamed", "fallback validated"):
        row = rows[kind]
        assert finals[kind].error is None
        assert finals[kind].answered_by == "extractive"
        assert (row["outcome"], row["model"], row["answered_by"]) == (
            "ok", "extractive", "extractive")
        assert (row["tokens_in"], row["tokens_out"], row["tokens_note"]) == (0, 0, "extractive")
        assert (row["fallback"], row["fallback_reason"]) == (True, "cut ollama/big:1.7b")
        assert row["first_chunk_ms"] is not None
        assert row["compute_ms"] is not None
    # Pieces of the failed streamed answer had gone out: the caller was told to drop them.
    assert resets == {"streamed": 1, "validated": 0}


async def test_with_accounting_off_the_log_keeps_its_accounting_columns_empty(
    nc: Any, nats_url: str, database_url: str, kb_index: Path, fake_ollama: Any, store: Any
) -> None:
    fake_ollama.responder = responder
    env = base_env(nats_url, database_url, kb_index, OLLAMA_HOST=fake_ollama.url,
                   OLLAMA_MODEL_NAME="big:1.7b", AVAP_PARSER_TIMEOUT="0", ACCOUNTING="off")
    rows = {}
    async with running(env):
        for kind, req in requests().items():
            final = (await ask_all(nc, req))[-1]
            assert final.answered_by == "ollama/big:1.7b"
            rows[kind] = await log_row(store, req)
    for row in rows.values():
        assert (row["outcome"], row["answered_by"]) == ("ok", "ollama/big:1.7b")
        assert (row["model"], row["tokens_in"], row["tokens_out"], row["tokens_note"],
                row["first_chunk_ms"], row["compute_ms"], row["fallback"],
                row["fallback_reason"]) == ("", 0, 0, "", None, None, False, "")
