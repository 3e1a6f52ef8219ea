"""The OpenAI door's models and restarts, driven by the official `openai` SDK against the
real routes with a scripted pipeline: the response's `model` names the model that wrote
the answer (the finishing chunk of a stream), a fleet model the agent's policy allows is
the request's `model` and any other is 404 `model_not_found`, `/v1/models` is each
agent's own, and a restarted answer never reaches the caller as two answers run
together. The real pipeline behind the same routes: tests/integration/
test_openai_door_fleet.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from shared.contracts.response import (
    ChunkKind,
    ErrorCode,
    ErrorInfo,
    PartInfo,
    PartResult,
    ResponseChunk,
    TokenUsage,
)
from shared.policy.agent import AgentPolicy
from testkit.fakes import FakePolicies
from tests.helpers.scripted_door import (
    DECISION,
    ScriptedDoor,
    client,
    final,
    serve_scripted,
    text,
)

USER: Any = [{"role": "user", "content": "q"}]


class Served:
    def __init__(self, door: ScriptedDoor, base: str, policies: FakePolicies) -> None:
        self.door, self.base, self.policies = door, base, policies


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    door, policies = ScriptedDoor(), FakePolicies()
    policies.policies["a"] = AgentPolicy(models=["cloud/big-1", "local/small"])
    policies.policies["b"] = AgentPolicy(models=["local/small"])
    async with serve_scripted(door, policies) as base:
        yield Served(door, base, policies)


async def read(stream: Any) -> list[Any]:
    return [chunk async for chunk in stream]


async def test_the_answer_is_named_by_the_model_that_wrote_it_with_its_usage(
    served: Served
) -> None:
    served.door.script = [text(0, "Use "), final(1, "it.", answered_by="cloud/big-1",
                                                 usage=TokenUsage(12, 3))]
    answer = await client(served.base).chat.completions.create(model="intentroute",
                                                               messages=USER)
    assert answer.model == "cloud/big-1"
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (12, 3)
    for include_usage in (True, False):
        chunks = await read(await client(served.base).chat.completions.create(
            model="intentroute", messages=USER, stream=True,
            stream_options={"include_usage": include_usage}))
        finish = next(i for i, c in enumerate(chunks)
                      if c.choices and c.choices[0].finish_reason)
        # Before the final chunk the door cannot know it: the name asked.
        assert {c.model for c in chunks[:finish]} == {"intentroute"}
        assert {c.model for c in chunks[finish:]} == {"cloud/big-1"}
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 3


async def test_the_name_asked_stays_when_no_model_is_named_and_parts_are_joined(
    served: Served
) -> None:
    served.door.script = [final(0, "ok")]
    answer = await client(served.base).chat.completions.create(model="intentroute/RETRIEVAL",
                                                               messages=USER)
    assert answer.model == "intentroute/RETRIEVAL"
    parts = [PartResult(index=i, text=f"q{i}", answered_by=by)
             for i, by in enumerate(["cloud/big-1", "extractive", "cloud/big-1"])]
    served.door.script = [final(0, "ok", answered_by="cloud/big-1", parts=parts)]
    answer = await client(served.base).chat.completions.create(model="intentroute",
                                                               messages=USER)
    assert answer.model == "cloud/big-1+extractive"


async def test_a_fleet_model_the_policy_allows_is_the_requests_model(served: Served) -> None:
    served.door.script = [final(0, "ok", answered_by="local/small")]
    answer = await client(served.base).chat.completions.create(model="local/small",
                                                               messages=USER)
    assert answer.model == "local/small"
    assert served.door.asked[-1].model == "local/small"
    assert served.door.asked[-1].query_type is None  # routed as ever
    await client(served.base).chat.completions.create(model="intentroute", messages=USER)
    assert served.door.asked[-1].model == ""


async def test_a_model_the_agent_may_not_choose_is_404_model_not_found(
    served: Served
) -> None:
    for key, model in (("other", "cloud/big-1"), ("good", "cloud/other"),
                       ("good", "big-1")):
        for stream in (False, True):
            with pytest.raises(openai.NotFoundError) as raised:
                await client(served.base, key).chat.completions.create(
                    model=model, messages=USER, stream=stream)
            error = raised.value
            assert (error.code, error.param, error.type) == (
                "model_not_found", "model", "invalid_request_error"), model
            assert model in error.message
    assert served.door.asked == []


async def test_the_pipelines_unknown_model_is_a_404_too(served: Served) -> None:
    """The generator refuses a model the fleet does not serve (and the gateway one the
    policy does not allow, should it change after the door's check): the final error
    before any text is the same 404."""
    served.door.script = [final(0, error=ErrorInfo(ErrorCode.UNKNOWN_MODEL,
                                                   "model 'cloud/big-1' is not served"),
                                decision=None, query_type="")]
    for stream in (False, True):
        with pytest.raises(openai.NotFoundError) as raised:
            await client(served.base).chat.completions.create(
                model="cloud/big-1", messages=USER, stream=stream)
        assert (raised.value.code, raised.value.param) == ("model_not_found", "model")


async def test_models_lists_the_routes_and_the_agents_own_models_as_they_change(
    served: Served
) -> None:
    routes = ["intentroute", "intentroute/RETRIEVAL", "intentroute/CODE_GENERATION",
              "intentroute/CONVERSATIONAL", "intentroute/PLATFORM"]
    listed = {key: [m.id async for m in client(served.base, key).models.list()]
              for key in ("good", "other")}
    assert sorted(listed["good"]) == sorted([*routes, "cloud/big-1", "local/small"])
    assert sorted(listed["other"]) == sorted([*routes, "local/small"])
    card = await client(served.base).models.retrieve("cloud/big-1")
    assert (card.id, card.owned_by) == ("cloud/big-1", "cloud")
    with pytest.raises(openai.NotFoundError) as raised:
        await client(served.base, "other").models.retrieve("cloud/big-1")
    assert raised.value.code == "model_not_found"
    served.policies.policies["b"] = AgentPolicy(models=["cloud/big-1"])
    ids = [m.id async for m in client(served.base, "other").models.list()]
    assert "cloud/big-1" in ids
    assert "local/small" not in ids


async def stream_text(base: str) -> tuple[str, openai.APIError | None]:
    """The content a streaming caller read, and the error the SDK raised (None)."""
    seen: list[str] = []
    try:
        async for chunk in await client(base).chat.completions.create(
                model="intentroute", messages=USER, stream=True):
            if chunk.choices:
                seen.append(chunk.choices[0].delta.content or "")
    except openai.APIError as exc:
        return "".join(seen), exc
    return "".join(seen), None


async def test_a_restart_after_text_went_out_ends_the_stream_with_an_error(
    served: Served
) -> None:
    served.door.script = [text(0, "word1 word2"), text(1, "", ChunkKind.RESET),
                          text(2, "Word1 "), text(3, "word2 word3"),
                          final(4, ".", answered_by="plain/ok")]
    seen, error = await stream_text(served.base)
    assert seen == "word1 word2"  # never the abandoned text followed by a second answer
    assert error is not None
    assert error.code == ErrorCode.ANSWER_RESTARTED
    assert "ask again" in error.message
    # Collected: the abandoned text dropped, the restarted answer alone.
    answer = await client(served.base).chat.completions.create(model="intentroute",
                                                               messages=USER)
    assert answer.choices[0].message.content == "Word1 word2 word3."
    assert answer.model == "plain/ok"


def part(seq: int, index: int, heading: str) -> ResponseChunk:
    """A split message's part marker (its heading is its text)."""
    return ResponseChunk(request_id="r", seq=seq, text=heading, kind=ChunkKind.PART,
                         part=PartInfo(index, 2, heading, DECISION))


async def test_a_reset_is_scoped_to_its_part_and_harmless_before_any_of_its_text(
    served: Served
) -> None:
    # Part 2 restarted before any of its text went out: the stream goes on.
    served.door.script = [part(0, 0, "### 1.\n"), text(1, "one"), part(2, 1, "\n### 2.\n"),
                          text(3, "", ChunkKind.RESET), text(4, "two"),
                          final(5, "", answered_by="m/x")]
    seen, error = await stream_text(served.base)
    assert error is None
    assert seen == "### 1.\none\n### 2.\ntwo"
    # Part 2 restarted after some of its text went out: an error, part 1 kept as sent.
    served.door.script = [part(0, 0, "### 1.\n"), text(1, "one"), part(2, 1, "\n### 2.\n"),
                          text(3, "tw"), text(4, "", ChunkKind.RESET), text(5, "two"),
                          final(6, "", answered_by="m/x")]
    seen, error = await stream_text(served.base)
    assert error is not None
    assert error.code == ErrorCode.ANSWER_RESTARTED
    assert seen == "### 1.\none\n### 2.\ntw"
    answer = await client(served.base).chat.completions.create(model="intentroute",
                                                               messages=USER)
    assert answer.choices[0].message.content == "### 1.\none\n### 2.\ntwo"
