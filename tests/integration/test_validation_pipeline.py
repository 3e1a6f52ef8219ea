"""CODE_GENERATION through the real parser gRPC service (RC-07, RC-08)."""

from __future__ import annotations

from typing import Any

import pytest

from intentroute.stack import free_port
from shared.contracts.response import ChunkKind, ValidationStatus
from tests.helpers.pipeline import ask_all, base_env, make_request, running

pytestmark = pytest.mark.integration

INVALID = "Here you go:\n```avap\naddParam(password, pwd)\ngetSHA256(pwd, hash)\n" \
          "returnResult(hash)\n```\n"
VALID = "Fixed:\n```avap\naddParam(password, pwd)\nencodeSHA256(pwd, hash)\n" \
        "addResult(hash)\n```\n"


def scripted(*answers: str) -> Any:
    calls = iter(answers)

    def respond(body: dict[str, Any]) -> list[str]:
        text = next(calls)
        return [text[i:i + 12] for i in range(0, len(text), 12)]

    return respond


def code_request() -> Any:
    return make_request("write an endpoint that hashes the password param",
                        query_type="CODE_GENERATION")


async def test_invalid_then_valid_is_retried_once_with_the_trace(
    nc, nats_url, database_url, kb_index, fake_ollama, parser
) -> None:
    url, servicer = parser
    fake_ollama.responder = scripted(INVALID, VALID)
    env = base_env(nats_url, database_url, kb_index, OLLAMA_HOST=fake_ollama.url,
                   OLLAMA_MODEL_NAME="big:1.7b", AVAP_PARSER_URL=url)
    async with running(env):
        chunks = await ask_all(nc, code_request())
    final = chunks[-1]
    assert final.validation_status == ValidationStatus.VALID
    assert final.retried is True
    assert "encodeSHA256(pwd, hash)" in final.avap_code
    assert len(fake_ollama.requests) == 2
    assert servicer.calls == 2
    retry_prompt = fake_ollama.requests[1]["messages"][0]["content"]
    assert "<parser_feedback>" in retry_prompt
    assert "encodeSHA256" in retry_prompt
    # RC-07: nothing of the code reached the caller before validation; the validated
    # answer (one piece) comes with the final chunk.
    assert [c.kind for c in chunks[:-1]] == [ChunkKind.STATUS] * (len(chunks) - 1)
    assert "encodeSHA256" in final.text


async def test_invalid_twice_is_delivered_unresolved_after_exactly_one_retry(
    nc, nats_url, database_url, kb_index, fake_ollama, parser, store
) -> None:
    url, servicer = parser
    fake_ollama.responder = scripted(INVALID, INVALID, INVALID)
    env = base_env(nats_url, database_url, kb_index, OLLAMA_HOST=fake_ollama.url,
                   OLLAMA_MODEL_NAME="big:1.7b", AVAP_PARSER_URL=url)
    async with running(env):
        req = code_request()
        chunks = await ask_all(nc, req)
    assert chunks[-1].validation_status == ValidationStatus.INVALID_UNRESOLVED
    assert len(fake_ollama.requests) == 2
    assert servicer.calls == 2
    row = await store.pool.fetchrow(
        "SELECT validation_status, retried FROM request_log WHERE request_id = $1",
        req.request_id)
    assert row["validation_status"] == "INVALID_UNRESOLVED"
    assert row["retried"] is True


async def test_parser_stopped_delivers_parser_unavailable(
    nc, nats_url, database_url, kb_index, fake_ollama
) -> None:
    fake_ollama.responder = scripted(VALID)
    env = base_env(nats_url, database_url, kb_index, OLLAMA_HOST=fake_ollama.url,
                   OLLAMA_MODEL_NAME="big:1.7b", AVAP_PARSER_URL=f"127.0.0.1:{free_port()}")
    async with running(env):
        chunks = await ask_all(nc, code_request())
    assert chunks[-1].validation_status == ValidationStatus.PARSER_UNAVAILABLE
    assert chunks[-1].avap_code
    assert len(fake_ollama.requests) == 1


async def test_parser_timeout_zero_makes_no_call_at_all(
    nc, nats_url, database_url, kb_index, fake_ollama, parser
) -> None:
    url, servicer = parser
    fake_ollama.responder = scripted(INVALID)
    env = base_env(nats_url, database_url, kb_index, OLLAMA_HOST=fake_ollama.url,
                   OLLAMA_MODEL_NAME="big:1.7b", AVAP_PARSER_URL=url, AVAP_PARSER_TIMEOUT="0")
    async with running(env):
        chunks = await ask_all(nc, code_request())
    assert chunks[-1].validation_status == ValidationStatus.PARSER_UNAVAILABLE
    assert servicer.calls == 0
    assert len(fake_ollama.requests) == 1
