"""The OpenAI door in front of a model fleet, on a real stack (NATS and Postgres with
authentication; the gateway, classifier, conversational generator and doors in-process)
against the fault-injecting provider (testkit.fault_provider), with the official `openai`
SDK as the client: the response's `model` and `usage` are those of the model that wrote
the answer (after a failover too), a fleet model the agent's policy allows answers when
named, any other is 404 `model_not_found` (the NATS door refuses it alike),
`/v1/models` is each agent's own and follows a policy change, and a restart mid-answer
never reaches a streaming caller as two answers run together.

Backends are named per run (their circuits live in the shared KV bucket). Every request
declares CONVERSATIONAL (the agents are trusted), so the conversational generator
answers it without retrieval."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import openai
import pytest

from shared.client.caller import ask
from shared.policy.agent import AgentPolicy
from shared.store import asyncpg_dsn
from shared.store.policies import save_policy
from testkit.fault_provider import ANSWER, WORDS, FaultProvider, is_complete
from tests.helpers.agents import Connections, add_agents
from tests.helpers.pipeline import base_env, door_addresses, make_request, running

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex[:6]
BAD, GOOD, PLAIN = (f"{name}-{RUN}" for name in ("bad", "good", "plain"))
NOWHERE = f"nowhere-{RUN}/x"  # a model no backend of the fleet serves
WORKERS = ("gateway", "classifier", "generator-conversational", "doors")
REFRESH_S = 1.0
# Agent -> its policy: the fleet models it may name, its chain after the first model.
POLICIES = {
    # Restarts a cut answer (PLAIN does not continue a prefill).
    "od-restart": AgentPolicy(models=[f"{BAD}/cut-40", f"{BAD}/503", f"{PLAIN}/ok", NOWHERE],
                              fallback={"conversational": [f"{PLAIN}/ok", "extractive"]}),
    # Continues a cut answer (GOOD does).
    "od-cont": AgentPolicy(models=[f"{BAD}/cut-40"],
                           fallback={"conversational": [f"{GOOD}/ok", "extractive"]}),
    "od-none": AgentPolicy(),
}
ROUTES = ["intentroute", "intentroute/RETRIEVAL", "intentroute/CODE_GENERATION",
          "intentroute/CONVERSATIONAL", "intentroute/PLATFORM"]


def fleet_toml(base_url: str) -> str:
    def backend(name: str, models: dict[str, str]) -> str:
        lines = [f"[backends.{name}]", 'kind = "openai"', f'url = "{base_url}"']
        lines += [f'[backends.{name}.models."{m}"]\n{spec}' for m, spec in models.items()]
        return "\n".join(lines)

    return "\n\n".join([
        backend(BAD, {"cut-40": "prefill = true", "503": "prefill = true"}),
        backend(GOOD, {"ok": "prefill = true"}),
        backend(PLAIN, {"ok": "prefill = false"}),
        f'[slots]\nmain = "{GOOD}/ok"\nconversational = "{GOOD}/ok"',
    ]) + "\n"


class Door:
    def __init__(self, url: str, tokens: dict[str, str], connect: Connections,
                 db: asyncpg.Connection) -> None:
        self.url, self.tokens, self.connect, self.db = url, tokens, connect, db

    def client(self, agent: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=self.tokens[agent],
                                  max_retries=0, timeout=60)

    async def create(self, agent: str, model: str, **fields: Any) -> Any:
        return await self.client(agent).chat.completions.create(
            model=model, messages=[{"role": "user", "content": "say that again"}],
            extra_body={"intentroute": {"query_type": "CONVERSATIONAL"}}, **fields)

    async def stream(self, agent: str, model: str) -> tuple[list[Any], openai.APIError | None]:
        """The chunks a streaming caller read, and the error the SDK raised (None)."""
        chunks: list[Any] = []
        try:
            async for chunk in await self.create(agent, model, stream=True,
                                                 stream_options={"include_usage": True}):
                chunks.append(chunk)
        except openai.APIError as exc:
            return chunks, exc
        return chunks, None

    async def models(self, agent: str) -> list[str]:
        return [m.id async for m in self.client(agent).models.list()]


@pytest.fixture(scope="module")
async def door(nats_url: str, database_url: str, kb_index: Path,
               tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Door]:
    creds = await add_agents(nats_url, database_url, dict.fromkeys(POLICIES, True))
    db = await asyncpg.connect(asyncpg_dsn(database_url))
    for agent, policy in POLICIES.items():
        await save_policy(db, agent, policy)
    fleet = tmp_path_factory.mktemp("fleet") / "fleet.toml"
    connect = Connections(nats_url, creds)
    _, http, listen = door_addresses()
    async with FaultProvider() as provider:
        fleet.write_text(fleet_toml(provider.base_url), encoding="utf-8")
        env = base_env(nats_url, database_url, kb_index, CLASSIFIER_HEADS_DIR="",
                       GENERATOR_BACKEND="openai", LLM_FLEET=str(fleet),
                       LLM_CIRCUIT_FAILURES="1000", POLICY_REFRESH=str(REFRESH_S),
                       **listen)
        try:
            async with running(env, WORKERS):
                yield Door(http, {a: c.token for a, c in creds.items()}, connect, db)
        finally:
            await connect.close()
            await db.execute("DELETE FROM agent_policies WHERE agent_id = ANY($1::text[])",
                             list(POLICIES))
            await db.close()


def content(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


@pytest.mark.timeout(300)
async def test_the_model_and_usage_are_the_answering_models_after_a_failover_too(
    door: Door
) -> None:
    # The slot's model answers a routed request.
    answer = await door.create("od-restart", "intentroute")
    assert (answer.model, answer.choices[0].message.content) == (f"{GOOD}/ok", ANSWER)
    assert answer.usage is not None
    assert answer.usage.completion_tokens == WORDS
    # The named model is down (503, every attempt): the chain's next model answers.
    answer = await door.create("od-restart", f"{BAD}/503")
    assert answer.model == f"{PLAIN}/ok"
    assert answer.model_extra is not None
    assert answer.model_extra["intentroute"]["answered_by"] == f"{PLAIN}/ok"
    assert is_complete(answer.choices[0].message.content or "")
    assert answer.usage is not None
    assert answer.usage.completion_tokens == WORDS  # the failed attempts are not billed
    chunks, error = await door.stream("od-restart", f"{BAD}/503")
    assert error is None
    assert is_complete(content(chunks))
    finish = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    assert finish.model == f"{PLAIN}/ok"
    assert chunks[-1].model == f"{PLAIN}/ok"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == WORDS


async def test_a_fleet_model_the_agent_may_choose_answers(door: Door) -> None:
    answer = await door.create("od-restart", f"{PLAIN}/ok")
    assert answer.model == f"{PLAIN}/ok"  # not the slot's GOOD
    assert answer.choices[0].message.content == ANSWER


async def test_a_model_the_agent_may_not_choose_or_the_fleet_lacks_is_404(door: Door) -> None:
    # Not in the agent's models=: refused by the door; in it, but no backend serves it:
    # refused by the generator before any text. One answer either way.
    for agent, model in (("od-none", f"{BAD}/cut-40"), ("od-cont", f"{PLAIN}/ok"),
                         ("od-restart", NOWHERE)):
        for stream in (False, True):
            with pytest.raises(openai.NotFoundError) as raised:
                await door.create(agent, model, stream=stream)
            assert (raised.value.code, raised.value.param) == ("model_not_found", "model")
            assert model in raised.value.message
    # The NATS door: the gateway refuses it with the same typed error.
    nc = await door.connect("od-none")
    req = make_request("say that again", agent_id="od-none", query_type="CONVERSATIONAL",
                       model=f"{PLAIN}/ok")
    chunks = [c async for c in ask(nc, req, timeout=30)]
    assert len(chunks) == 1
    assert chunks[0].error is not None
    assert chunks[0].error.code == "UNKNOWN_MODEL"


async def test_models_are_each_agents_own_and_follow_a_policy_change(door: Door) -> None:
    assert await door.models("od-none") == ROUTES
    assert await door.models("od-cont") == [*ROUTES, f"{BAD}/cut-40"]
    await save_policy(door.db, "od-none", AgentPolicy(models=[f"{PLAIN}/ok"]))
    try:
        tries = int((REFRESH_S + 10) / 0.2)
        for _ in range(tries):  # the doors re-read the policies every REFRESH_S
            listed = await door.models("od-none")
            if listed != ROUTES:
                break
            await asyncio.sleep(0.2)
        assert listed == [*ROUTES, f"{PLAIN}/ok"]
        # The gateway and the generator follow it too: the model answers.
        for attempt in range(tries):
            try:
                answer = await door.create("od-none", f"{PLAIN}/ok")
                break
            except openai.NotFoundError:
                if attempt == tries - 1:
                    raise
                await asyncio.sleep(0.2)
        assert answer.model == f"{PLAIN}/ok"
    finally:
        await save_policy(door.db, "od-none", POLICIES["od-none"])


@pytest.mark.timeout(300)
async def test_a_streamed_restart_after_text_went_out_is_an_error_never_two_answers(
    door: Door
) -> None:
    # The named model cuts its answer after 40 words; the agent's next model restarts it.
    chunks, error = await door.stream("od-restart", f"{BAD}/cut-40")
    assert error is not None, content(chunks)
    assert error.code == "ANSWER_RESTARTED"
    seen = content(chunks).split()
    assert 0 < len(seen) <= 40
    assert seen == ANSWER.split()[:len(seen)]  # what went out, and nothing after it
    # Collected: the abandoned words dropped, the restarted answer alone.
    answer = await door.create("od-restart", f"{BAD}/cut-40")
    assert answer.choices[0].message.content == ANSWER
    assert answer.model == f"{PLAIN}/ok"
    # A model that continues the cut answer: the text goes on, one whole answer.
    chunks, error = await door.stream("od-cont", f"{BAD}/cut-40")
    assert error is None
    assert content(chunks) == ANSWER
    assert chunks[-1].model == f"{GOOD}/ok"
