"""The OpenAI-compatible door on a real stack (NATS and Postgres with authentication,
every worker in-process, the generators on a fake Ollama over HTTP), with the official
`openai` SDK as the client: streamed and collected answers with their route and usage,
the session of a conversation, a per-agent limit's refusal as RateLimitError with
Retry-After (the door publishes through the same pipeline, so the limit and its
request-log row are the NATS door's), a wrong key, the models, /healthz and /readyz."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import openai
import pytest

from shared.policy.agent import AgentPolicy
from shared.store import asyncpg_dsn
from shared.store.policies import save_policy
from tests.helpers.agents import add_agents
from tests.helpers.fake_ollama import FakeOllama
from tests.helpers.pipeline import base_env, running

pytestmark = pytest.mark.integration

MODEL = "big:1.7b"
WORKERS = ("gateway", "classifier", "retriever", "generator-main",
           "generator-conversational", "validator", "doors")
# `oai-t` is trusted (its models declare the route); `oai-rate` has a bucket of one
# request, refilled one a minute.
AGENTS = {"oai-t": True, "oai-rate": False}
PIECES = ["Use ", "startLoop ", "to ", "count."]


class Stack:
    def __init__(self, url: str, tokens: dict[str, str], ollama: FakeOllama,
                 db: asyncpg.Connection) -> None:
        self.url = url
        self.tokens = tokens
        self.ollama = ollama
        self.db = db

    def client(self, agent: str = "oai-t", key: str = "") -> openai.AsyncOpenAI:
        # max_retries=0: the SDK would otherwise wait out a 429's Retry-After and retry.
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1",
                                  api_key=key or self.tokens[agent], max_retries=0)

    async def logged(self, agent: str, request_id: str) -> asyncpg.Record:
        """The request's request-log row (written just after its final chunk)."""
        for _ in range(100):
            row = await self.db.fetchrow(
                "SELECT outcome, session_id, query_type FROM request_log "
                "WHERE agent_id = $1 AND request_id = $2", agent, request_id)
            if row is not None:
                return row
            await asyncio.sleep(0.05)
        raise AssertionError(f"no request-log row for {request_id}")


@pytest.fixture(scope="module")
async def door(nats_url: str, database_url: str, kb_index: Path) -> AsyncIterator[Stack]:
    from intentroute.stack import free_port

    creds = await add_agents(nats_url, database_url, AGENTS)
    db = await asyncpg.connect(asyncpg_dsn(database_url))
    await db.execute("DELETE FROM agent_limit_state WHERE agent_id = ANY($1::text[])",
                     list(AGENTS))
    await save_policy(db, "oai-rate", AgentPolicy(rate=1 / 60, burst=1))
    ollama = await FakeOllama(responder=lambda body: list(PIECES), token_delay=0.02).start()
    port = free_port()
    env = base_env(nats_url, database_url, kb_index, OLLAMA_HOST=ollama.url,
                   OLLAMA_MODEL_NAME=MODEL, AVAP_PARSER_TIMEOUT="0",
                   GATEWAY_HTTP_LISTEN=f"127.0.0.1:{port}")
    try:
        async with running(env, WORKERS):
            yield Stack(f"http://127.0.0.1:{port}", {a: c.token for a, c in creds.items()},
                        ollama, db)
    finally:
        await db.execute("DELETE FROM agent_policies WHERE agent_id = ANY($1::text[])",
                         list(AGENTS))
        await db.close()
        await ollama.stop()


@pytest.mark.timeout(300)
async def test_the_sdk_streams_an_answer_with_its_route_and_the_usage_the_model_reported(
    door: Stack
) -> None:
    stream = await door.client().chat.completions.create(
        model="intentroute/RETRIEVAL",
        messages=[{"role": "user", "content": "how do I count in a loop?"}],
        stream=True, stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    contents = [c.choices[0].delta.content for c in chunks if c.choices
                and c.choices[0].delta.content]
    assert "".join(contents) == "".join(PIECES)
    assert len(contents) > 1  # streamed as the model wrote it, not in one piece
    finish = next(c for c in chunks if c.choices and c.choices[0].finish_reason == "stop")
    assert finish.model_extra is not None
    info = finish.model_extra["intentroute"]
    assert info["query_type"] == "RETRIEVAL"
    assert info["decision"]["layer"] == "declared"
    assert info["answered_by"] == f"ollama/{MODEL}"
    usage = chunks[-1].usage
    assert chunks[-1].choices == []
    assert usage is not None
    _, prompt, completion = door.ollama.reported[-1]
    assert (usage.prompt_tokens, usage.completion_tokens) == (prompt, completion)
    row = await door.logged("oai-t", info["request_id"])
    assert row["outcome"] == "ok"


async def test_a_collected_answer_carries_the_system_message_as_context_and_route_headers(
    door: Stack
) -> None:
    raw = await door.client().chat.completions.with_raw_response.create(
        model="intentroute/PLATFORM",
        messages=[{"role": "system", "content": "usage=20% of the plan"},
                  {"role": "user", "content": "give me one tip about my usage"}])
    answer = raw.parse()
    assert answer.choices[0].message.content == "".join(PIECES)
    assert answer.choices[0].finish_reason == "stop"
    assert raw.headers["X-Intentroute-Query-Type"] == "PLATFORM"
    assert raw.headers["X-Intentroute-Answered-By"] == f"ollama/{MODEL}"
    request_id = raw.headers["X-Intentroute-Request-Id"]
    assert answer.id == f"chatcmpl-{request_id}"
    # The system message reached the PLATFORM prompt as the request's extra_context.
    assert "usage=20% of the plan" in str(door.ollama.requests[-1]["messages"])
    assert answer.usage is not None
    assert answer.usage.completion_tokens == len(PIECES)
    assert (await door.logged("oai-t", request_id))["query_type"] == "PLATFORM"


async def test_the_turns_of_one_conversation_share_a_session_a_header_names_another(
    door: Stack
) -> None:
    client = door.client()
    first = [{"role": "user", "content": "what does addParam do?"}]
    one = await client.chat.completions.create(model="intentroute", messages=first)
    second = [*first, {"role": "assistant", "content": one.choices[0].message.content},
              {"role": "user", "content": "and addResult?"}]
    two = await client.chat.completions.create(model="intentroute", messages=second)
    named = await client.chat.completions.create(
        model="intentroute", messages=second, extra_headers={"X-Session-Id": "oai-named"})
    sessions = [(await door.logged("oai-t", c.id.removeprefix("chatcmpl-")))["session_id"]
                for c in (one, two, named)]
    assert sessions[0] == sessions[1]
    assert sessions[2] == "oai-named"


@pytest.mark.timeout(120)
async def test_a_request_id_asked_again_after_its_answer_is_a_409_duplicate(
    door: Stack
) -> None:
    """A request id is admitted once (its answer and its request-log row are never
    rewritten by a later message naming it): asked again, it is a 409 at once, not a
    second run and not a wait for the door's timeout."""
    client = openai.AsyncOpenAI(base_url=f"{door.url}/v1", api_key=door.tokens["oai-t"],
                                max_retries=0, timeout=30)
    answer = await client.chat.completions.create(
        model="intentroute", messages=[{"role": "user", "content": "how do I count?"}],
        extra_body={"intentroute": {"request_id": "oai-again-1"}})
    assert answer.choices[0].message.content == "".join(PIECES)
    for stream in (False, True):
        with pytest.raises(openai.ConflictError) as refused:
            await client.chat.completions.create(
                model="intentroute", messages=[{"role": "user", "content": "again"}],
                extra_body={"intentroute": {"request_id": "oai-again-1"}}, stream=stream)
        assert refused.value.code == "DUPLICATE_REQUEST"


async def test_a_rate_limit_refusal_is_a_rate_limit_error_with_retry_after(door: Stack) -> None:
    client = door.client("oai-rate")
    ok = await client.chat.completions.create(
        model="intentroute", messages=[{"role": "user", "content": "how do I count?"}])
    assert ok.choices[0].message.content
    for stream in (False, True):
        with pytest.raises(openai.RateLimitError) as refused:
            await client.chat.completions.create(
                model="intentroute", messages=[{"role": "user", "content": "again?"}],
                stream=stream)
        assert refused.value.code == "RATE_LIMITED"
        assert refused.value.type == "rate_limit_error"
        headers = refused.value.response.headers
        assert 1 <= int(headers["Retry-After"]) <= 60
        assert 0 < int(headers["retry-after-ms"]) <= 60_000
        # Refused by the gateway's limits gate in the pipeline, logged as on NATS.
        row = await door.logged("oai-rate", headers["X-Intentroute-Request-Id"])
        assert row["outcome"] == "error:RATE_LIMITED"


async def test_a_wrong_key_is_an_authentication_error_and_models_are_listed(door: Stack) -> None:
    with pytest.raises(openai.AuthenticationError) as refused:
        await door.client(key="oai-t.wrong").chat.completions.create(
            model="intentroute", messages=[{"role": "user", "content": "q"}])
    assert refused.value.code == "UNAUTHENTICATED"
    ids = [model.id async for model in door.client().models.list()]
    assert ids[0] == "intentroute"
    assert "intentroute/CODE_GENERATION" in ids


async def test_healthz_and_readyz_answer_on_a_running_gateway(door: Stack) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{door.url}/healthz") as resp:
            assert resp.status == 200
        async with http.get(f"{door.url}/readyz") as resp:
            assert resp.status == 200
            body: dict[str, Any] = await resp.json()
    assert body == {"status": "ready",
                    "checks": {"nats": "ok", "postgres": "ok", "consumers": "ok"}}
