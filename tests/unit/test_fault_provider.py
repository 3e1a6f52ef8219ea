"""The fault-injecting provider (testkit.fault_provider) speaks OpenAI's wire format as
OpenAI's own SDK reads it, and each of its models fails as its name says, as the
fleet's OpenAI client (shared.llm.openai) classifies it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import openai
import pytest

from shared.llm.choice import Choice
from shared.llm.faults import Fault, ModelError
from shared.llm.openai import OpenAIBackend
from shared.llm.ports import ChatMessage, Ended, Started, StreamEvent, TokenCounts
from testkit.fault_provider import ANSWER, FAULTS, PIECES, FaultProvider, is_complete

MESSAGES = [ChatMessage("user", "hi there")]


@pytest.fixture
async def provider() -> AsyncIterator[FaultProvider]:
    async with FaultProvider(slow_ttft_s=0.4) as served:
        yield served


@pytest.fixture
async def client(provider: FaultProvider) -> AsyncIterator[OpenAIBackend]:
    backend = OpenAIBackend(provider.base_url, name="faults", timeout=10)
    yield backend
    await backend.aclose()


async def events(client: OpenAIBackend, model: str, *, prefill: str = "",
                 within: float = 3.0) -> tuple[list[StreamEvent], ModelError | None]:
    """The events of one call, and the error it ended in (None: it ended)."""
    got: list[StreamEvent] = []

    async def run() -> None:
        async for event in client.stream(model, MESSAGES, prefill=prefill):
            got.append(event)

    try:
        await asyncio.wait_for(run(), within)
    except ModelError as exc:
        return got, exc
    return got, None


def text(got: list[StreamEvent]) -> str:
    return "".join(e for e in got if isinstance(e, str))


async def test_ok_streams_the_known_answer_with_its_counts_and_end(
    client: OpenAIBackend, provider: FaultProvider,
) -> None:
    got, error = await events(client, "ok")
    assert error is None
    assert got[0] == Started()
    assert text(got) == ANSWER
    assert is_complete(text(got))
    assert TokenCounts(2, 60) in got
    assert got[-1] == Ended(marked=True, finish_reason="stop")
    [call] = provider.calls
    assert (call.model, call.stream, call.prefill_words, call.outcome) == ("ok", True, -1, "200")


async def test_a_prefill_is_continued_with_the_rest_of_the_words(
    client: OpenAIBackend, provider: FaultProvider,
) -> None:
    prefill = "".join(PIECES[:40])
    got, error = await events(client, "ok", prefill=prefill)
    assert error is None
    assert prefill + text(got) == ANSWER
    assert provider.calls[0].prefill_words == 40
    assert provider.calls[0].body["messages"][-1] == {"role": "assistant", "content": prefill}


@pytest.mark.parametrize(("model", "fault", "words"), [
    ("cut-40", Fault.CUT, 40),
    ("reset", Fault.RESET, 0),
    ("429", Fault.OVERLOADED, 0),
    ("503", Fault.OVERLOADED, 0),
    ("500", Fault.SERVER_ERROR, 0),
    ("context-length", Fault.CONTEXT_LENGTH, 0),
    ("content-filter", Fault.CONTENT_FILTER, 0),
    ("content-filter-mid", Fault.CONTENT_FILTER, 20),
])
async def test_each_failing_model_fails_as_its_name_says(
    client: OpenAIBackend, model: str, fault: Fault, words: int,
) -> None:
    got, error = await events(client, model)
    assert error is not None
    assert error.fault is fault, error
    assert len(text(got).split()) == words
    assert text(got) == "".join(PIECES[:words])


async def test_the_once_faults_fail_then_answer(client: OpenAIBackend) -> None:
    _, error = await events(client, "429-retry")
    assert error is not None
    assert (error.fault, error.retry_after, error.status) == (Fault.RATE_LIMITED, 1.0, 429)
    got, error = await events(client, "429-retry")
    assert error is None
    assert is_complete(text(got))
    _, error = await events(client, "500-once")
    assert error is not None
    assert error.fault is Fault.SERVER_ERROR
    got, error = await events(client, "500-once")
    assert error is None
    assert is_complete(text(got))


async def test_a_stall_and_a_silence_hold_the_caller_until_it_leaves(
    client: OpenAIBackend, provider: FaultProvider,
) -> None:
    with pytest.raises(TimeoutError):
        await events(client, "silent", within=0.5)
    got: list[StreamEvent] = []

    async def read_stall() -> None:
        async for event in client.stream("stall", MESSAGES):
            got.append(event)

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(read_stall(), 0.6)
    assert got[0] == Started()
    assert text(got) == "".join(PIECES[:20])
    assert [c.outcome for c in provider.calls] == ["silent", "stall"]


async def test_slow_ttft_answers_at_once_and_sends_the_first_word_late(
    client: OpenAIBackend,
) -> None:
    started = time.monotonic()
    first: dict[str, float] = {}
    async for event in client.stream("slow-ttft", MESSAGES):
        first.setdefault(type(event).__name__, time.monotonic() - started)
    assert first["Started"] < 0.3
    assert first["str"] >= 0.4


async def test_a_malformed_chunk_is_skipped_and_an_unmarked_end_is_said(
    client: OpenAIBackend,
) -> None:
    got, error = await events(client, "malformed")
    assert error is None
    assert is_complete(text(got))
    assert got[-1] == Ended(marked=True, finish_reason="stop")
    got, error = await events(client, "no-done")
    assert error is None
    assert is_complete(text(got))
    assert got[-1] == Ended(marked=False, finish_reason="")


async def test_prefill_reject_refuses_only_a_prefill(client: OpenAIBackend) -> None:
    got, error = await events(client, "prefill-reject")
    assert error is None
    assert is_complete(text(got))
    _, error = await events(client, "prefill-reject", prefill="word1 word2")
    assert error is not None
    assert error.fault is Fault.PREFILL_REFUSED


async def test_flap_is_down_for_the_period_then_up(
    client: OpenAIBackend, provider: FaultProvider,
) -> None:
    provider.go_down(0.3)
    _, error = await events(client, "flap")
    assert error is not None
    assert error.fault is Fault.OVERLOADED
    await asyncio.sleep(0.35)
    got, error = await events(client, "flap")
    assert error is None
    assert is_complete(text(got))
    assert [c.outcome for c in provider.calls] == ["503", "200"]


async def test_openais_own_sdk_reads_the_stream_the_errors_and_the_models(
    provider: FaultProvider,
) -> None:
    sdk = openai.AsyncOpenAI(base_url=provider.base_url, api_key="k", max_retries=0)
    stream = await sdk.chat.completions.create(
        model="ok", messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ANSWER
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 60
    whole = await sdk.chat.completions.create(
        model="ok", messages=[{"role": "user", "content": "hi"}])
    assert whole.choices[0].message.content == ANSWER
    with pytest.raises(openai.RateLimitError) as limited:
        await sdk.chat.completions.create(
            model="429-retry", messages=[{"role": "user", "content": "hi"}])
    assert limited.value.response.headers["retry-after"] == "1"
    assert limited.value.code == "rate_limit_exceeded"
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk.chat.completions.create(
            model="context-length", messages=[{"role": "user", "content": "hi"}])
    assert refused.value.code == "context_length_exceeded"
    with pytest.raises(openai.APIConnectionError):
        await sdk.chat.completions.create(
            model="reset", messages=[{"role": "user", "content": "hi"}])
    listed = {m.id async for m in sdk.models.list()}
    assert set(FAULTS) <= listed
    await sdk.close()


async def test_a_label_request_gets_an_allowed_value_or_the_models_fault(
    client: OpenAIBackend,
) -> None:
    label = Choice("type", ("A", "B"))
    assert await client.choose("ok", MESSAGES, label, timeout=2) == "A"
    with pytest.raises(ModelError) as refused:
        await client.choose("context-length", MESSAGES, label, timeout=2)
    assert refused.value.fault is Fault.CONTEXT_LENGTH
    with pytest.raises(ModelError) as silent:
        await client.choose("silent", MESSAGES, label, timeout=0.3)
    assert silent.value.fault is Fault.NO_RESPONSE
