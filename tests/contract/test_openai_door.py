"""The OpenAI door's wire format, driven by the official `openai` SDK against the real
aiohttp routes with a scripted pipeline (a Door whose answers are given chunks): what
the SDK parses, the events of a stream in OpenAI's order, errors mid-stream, the
mapping of a chat request onto AgentRequest. The real pipeline behind the same routes
is tests/integration/test_openai_door.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from types import SimpleNamespace
from typing import Any, ClassVar

import aiohttp
import nats.errors
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from services.doors.door import BusUnavailableError, Door, bus_failed
from services.doors.health import Readiness, add_health_routes
from services.doors.http import start_http
from services.doors.openai_door import wire
from services.doors.openai_door.routes import add_openai_routes
from services.doors.throttle import AuthThrottle, BodyBudget
from shared.client.answers import RequestInFlightError
from shared.client.caller import AnswerTimeoutError
from shared.contracts.codec import encode
from shared.contracts.request import AgentRequest
from shared.contracts.response import (
    ChunkKind,
    ErrorCode,
    ErrorInfo,
    ResponseChunk,
    TokenUsage,
    response_subject,
)
from shared.contracts.routing import QueryType
from tests.helpers.scripted_door import ScriptedDoor, client, final, text


class FakePool:
    def __init__(self) -> None:
        self.down = False

    async def fetchval(self, query: str) -> int:
        if self.down:
            raise OSError("connection refused")
        return 1


class FakeNats:
    is_connected = True


@pytest.fixture
async def served() -> AsyncIterator[tuple[ScriptedDoor, str, dict[str, Any]]]:
    door = ScriptedDoor()
    app = web.Application(client_max_size=64 * 1024)  # as the gateway's (http.py)
    add_openai_routes(app, door)
    probes: dict[str, Any] = {"pool": FakePool(), "nc": FakeNats(), "consuming": True}
    add_health_routes(app, Readiness(probes["nc"], probes["pool"],  # type: ignore[arg-type]
                                     lambda: bool(probes["consuming"])))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield door, str(server.make_url("")), probes
    await server.close()


async def test_a_streamed_answer_reads_as_openai_chunks_with_usage_last_and_route_info(
    served: tuple[ScriptedDoor, str, dict[str, Any]]
) -> None:
    door, base, _ = served
    door.script = [text(0, "checking", ChunkKind.STATUS), text(1, "Use "), text(2, "startLoop"),
                   final(3, ".", answered_by="ollama/m", usage=TokenUsage(12, 3))]
    stream = await client(base).chat.completions.create(
        model="intentroute", messages=[{"role": "user", "content": "how do I loop?"}],
        stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "Use startLoop.")
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finish] == ["stop"]
    assert finish[0].model_extra is not None
    info = finish[0].model_extra["intentroute"]
    assert info["query_type"] == "RETRIEVAL"
    assert info["answered_by"] == "ollama/m"
    assert info["decision"]["layer"] == "rules"
    # OpenAI's include_usage: null usage on every chunk, then one with no choices.
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens,
            chunks[-1].usage.total_tokens) == (12, 3, 15)
    assert len({c.id for c in chunks}) == 1


async def test_the_raw_stream_ends_with_done_and_carries_usage_once_without_include_usage(
    served: tuple[ScriptedDoor, str, dict[str, Any]]
) -> None:
    door, base, _ = served
    door.script = [text(0, "a"), final(1, "b", usage=TokenUsage(5, 2))]
    async with aiohttp.ClientSession() as http, http.post(
            f"{base}/v1/chat/completions", headers={"Authorization": "Bearer good"},
            json={"model": "intentroute", "stream": True,
                  "messages": [{"role": "user", "content": "q"}]}) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.headers["X-Intentroute-Request-Id"] == door.asked[0].request_id
        body = (await resp.read()).decode()
    events = [e.removeprefix("data: ") for e in body.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    assert sum('"usage"' in e for e in events) == 1
    assert '"finish_reason":"stop"' in events[-2]
    assert '"total_tokens":7' in events[-2]


async def test_one_agents_bytes_past_its_body_budget_are_429_before_they_are_parsed(
) -> None:
    door = ScriptedDoor()
    door.script = [final(0, "ok")]
    app = web.Application(client_max_size=64 * 1024)
    add_openai_routes(app, door, BodyBudget("4/second"))  # 4 KiB a second
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    body = {"model": "intentroute", "messages": [{"role": "user", "content": "q" * 3000}]}
    try:
        sdk = client(str(server.make_url("")))
        await sdk.chat.completions.create(**body)  # ~3 KiB: within the budget
        with pytest.raises(openai.RateLimitError) as raised:
            await sdk.chat.completions.create(**body)
        assert raised.value.code == "RATE_LIMITED"
        assert int(raised.value.response.headers["Retry-After"]) >= 1
        assert len(door.asked) == 1  # the refused body went no further
    finally:
        await server.close()


def test_the_body_budget_is_each_agents_own() -> None:
    budget = BodyBudget("4/second")
    assert budget.spend("a", 3 * 1024) == 0
    assert budget.spend("a", 3 * 1024) >= 1
    assert budget.spend("b", 3 * 1024) == 0
    assert BodyBudget("").spend("a", 10**9) == 0  # off


def _timing(header: str) -> dict[str, float]:
    """`Server-Timing: door;dur=0.2, pipeline;dur=5` -> {"door": 0.2, "pipeline": 5.0}."""
    metrics = (part.strip().split(";dur=") for part in header.split(","))
    return {name: float(value) for name, value in metrics}


async def test_server_timing_tells_the_doors_own_time_from_the_pipelines(
    served: tuple[ScriptedDoor, str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    door, base, _ = served
    door.script = [text(0, "a"), final(1, "b")]
    scripted = door.answer

    async def slow_pipeline(req: AgentRequest, **tracing: Any
                            ) -> AsyncGenerator[ResponseChunk, None]:
        await asyncio.sleep(0.2)  # the workers' time
        async for chunk in scripted(req, **tracing):
            yield chunk

    monkeypatch.setattr(door, "answer", slow_pipeline)
    body = {"model": "intentroute", "messages": [{"role": "user", "content": "q"}]}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/chat/completions", json=body,
                             headers={"Authorization": "Bearer good"}) as resp:
            collected = _timing(resp.headers["Server-Timing"])
        async with http.post(f"{base}/v1/chat/completions", json={**body, "stream": True},
                             headers={"Authorization": "Bearer good"}) as resp:
            streamed = _timing(resp.headers["Server-Timing"])
            await resp.read()
    assert collected["pipeline"] >= 200
    assert 0 < collected["door"] < 100
    assert set(streamed) == {"door"}  # sent before the answer: the door's part so far
    assert 0 < streamed["door"] < 100


async def test_an_error_after_text_is_an_error_event_the_sdk_raises(
    served: tuple[ScriptedDoor, str, dict[str, Any]]
) -> None:
    door, base, _ = served
    # The text that went out is reset before the error (the generator's way): the
    # answer's own error is what the caller gets, the reset itself never reaches it.
    door.script = [text(0, "partial"), text(1, "", ChunkKind.RESET),
                   final(2, error=ErrorInfo(ErrorCode.STAGE_FAILED, "the generator failed"))]
    stream = await client(base).chat.completions.create(
        model="intentroute", messages=[{"role": "user", "content": "q"}], stream=True)
    seen: list[Any] = []

    async def read_all() -> None:
        async for chunk in stream:
            seen.append(chunk)

    with pytest.raises(openai.APIError) as raised:
        await read_all()
    assert raised.value.code == ErrorCode.STAGE_FAILED
    assert "".join(c.choices[0].delta.content or "" for c in seen) == "partial"
    assert all(not c.model_extra or "intentroute" not in c.model_extra for c in seen)


async def test_a_refusal_before_any_text_is_its_http_status_streamed_or_not(
    served: tuple[ScriptedDoor, str, dict[str, Any]]
) -> None:
    door, base, _ = served
    door.script = [final(0, error=ErrorInfo(ErrorCode.QUOTA_EXCEEDED, "tokens", 1500),
                         decision=None, query_type="")]
    for stream in (False, True):
        with pytest.raises(openai.RateLimitError) as raised:
            await client(base).chat.completions.create(
                model="intentroute", messages=[{"role": "user", "content": "q"}],
                stream=stream)
        assert raised.value.code == ErrorCode.QUOTA_EXCEEDED
        assert raised.value.response.headers["Retry-After"] == "2"
        assert raised.value.response.headers["retry-after-ms"] == "1500"


async def test_no_final_in_time_is_504_deadline_exceeded(
    served: tuple[ScriptedDoor, str, dict[str, Any]]
) -> None:
    door, base, _ = served
    door.script = [AnswerTimeoutError("no final chunk within 5s")]
    with pytest.raises(openai.APIStatusError) as raised:
        await client(base).chat.completions.create(
            model="intentroute", messages=[{"role": "user", "content": "q"}])
    assert raised.value.status_code == 504
    assert raised.value.code == ErrorCode.DEADLINE_EXCEEDED



@contextlib.asynccontextmanager
async def gateway_served(answer: Any) -> AsyncIterator[str]:
    """A door whose answers come from `answer`, served as the gateway serves it
    (start_http: aiohttp's TestServer treats a client that leaves otherwise); its URL."""
    door = ScriptedDoor()
    door.answer = answer  # type: ignore[method-assign]
    app = web.Application()
    add_openai_routes(app, door)
    runner, base = await start_http(app, "127.0.0.1:0")
    try:
        yield base
    finally:
        await runner.cleanup()


async def leave_mid_stream(base: str) -> None:
    """Ask for a stream, read up to its first text ("partial"), and leave."""
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{base}/v1/chat/completions",
                               headers={"Authorization": "Bearer good"},
                               json={"model": "intentroute", "stream": True,
                                     "messages": [{"role": "user", "content": "q"}]})
        assert b"partial" in await resp.content.readuntil(b"partial")
        resp.close()


async def test_a_client_gone_before_the_doors_timeout_ends_its_stream_without_a_traceback(
    caplog: pytest.LogCaptureFixture
) -> None:
    left = asyncio.Event()

    async def stalled(req: AgentRequest, **tracing: Any) -> AsyncGenerator[ResponseChunk, None]:
        yield text(0, "partial")
        await left.wait()
        await asyncio.sleep(0.2)  # the server sees the connection closed (one loop turn)
        raise AnswerTimeoutError("no final chunk within 5s")  # the pipeline stalled

    caplog.set_level(logging.DEBUG, logger="intentroute.doors.openai")
    async with gateway_served(stalled) as base:
        await leave_mid_stream(base)
        left.set()
        for _ in range(100):
            if any("the client left" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.05)
    # Before the fix: "Error handling request" (aiohttp.server) and the traceback of the
    # 504 event written to the closed connection.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert any("the client left" in r.getMessage() for r in caplog.records)


async def test_a_client_gone_mid_stream_stops_its_answer_being_followed_at_once() -> None:
    # A pipeline that never ends the answer: the door used to follow it for its whole
    # timeout (120 s) for a client long gone; the handler is now cancelled when the
    # connection closes, and the answer's follower closed with it.
    followed_until = asyncio.Event()

    async def endless(req: AgentRequest, **tracing: Any) -> AsyncGenerator[ResponseChunk, None]:
        try:
            yield text(0, "partial")
            await asyncio.Event().wait()
        finally:
            followed_until.set()

    async with gateway_served(endless) as base:
        await leave_mid_stream(base)
        await asyncio.wait_for(followed_until.wait(), 10)


async def test_nats_failing_the_request_is_a_503_bus_unavailable_before_or_after_text(
    served: tuple[ScriptedDoor, str, dict[str, Any]]
) -> None:
    door, base, _ = served
    # The publish's JetStream ack never came (Door.answer raises it so: below).
    door.script = [bus_failed(nats.errors.TimeoutError())]
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError) as raised:
            await client(base).chat.completions.create(
                model="intentroute", messages=[{"role": "user", "content": "q"}],
                stream=stream)
        assert raised.value.status_code == 503
        assert raised.value.code == ErrorCode.BUS_UNAVAILABLE
        assert raised.value.response.headers["Retry-After"] == "1"
    door.script = [text(0, "partial"), bus_failed(nats.errors.ConnectionClosedError())]
    events = await client(base).chat.completions.create(
        model="intentroute", messages=[{"role": "user", "content": "q"}], stream=True)
    with pytest.raises(openai.APIError) as mid:
        async for _ in events:
            pass
    assert mid.value.code == ErrorCode.BUS_UNAVAILABLE


async def test_the_door_turns_nats_failing_the_publish_into_bus_unavailable(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("shared.client.caller.PUBLISH_PATIENCE", 0.0)  # no resends

    class Unacked(_Nats):
        def jetstream(self) -> Any:
            async def publish(*args: Any, **kwargs: Any) -> None:
                raise nats.errors.TimeoutError
            return SimpleNamespace(publish=publish)

    door = Door(Unacked(), None, AuthThrottle(""), answer_timeout=5)  # type: ignore[arg-type]
    answer = door.answer(AgentRequest(request_id="r1", session_id="s", query="q",
                                      agent_id="a"))
    with pytest.raises(BusUnavailableError) as raised:
        await anext(answer)
    assert raised.value.retryable
    assert raised.value.retry_after_ms == 1000
    assert door.stats.handled == 1



async def test_a_request_id_in_flight_already_is_a_409_conflict(
    served: tuple[ScriptedDoor, str, dict[str, Any]]
) -> None:
    door, base, _ = served
    door.script = [RequestInFlightError("request 'dup' of agent 'a' is waiting already")]
    for stream in (False, True):
        with pytest.raises(openai.ConflictError) as raised:
            await client(base).chat.completions.create(
                model="intentroute", messages=[{"role": "user", "content": "q"}],
                stream=stream, extra_body={"intentroute": {"request_id": "dup"}})
        assert raised.value.code == ErrorCode.DUPLICATE_REQUEST

async def test_a_body_missing_messages_or_not_an_object_names_the_right_param(
    served: tuple[ScriptedDoor, str, dict[str, Any]]
) -> None:
    _, base, _ = served
    params = {}
    async with aiohttp.ClientSession() as http:
        for name, body in (("missing", {"model": "intentroute"}), ("array", [1, 2])):
            async with http.post(f"{base}/v1/chat/completions", json=body,
                                 headers={"Authorization": "Bearer good"}) as resp:
                assert resp.status == 400
                params[name] = (await resp.json())["error"]["param"]
    assert params == {"missing": "messages", "array": None}


class _Sub:
    async def unsubscribe(self) -> None:
        pass


class _Nats:
    """Enough of a NATS client for Door.answer: publishes go nowhere."""

    stats: ClassVar[dict[str, int]] = {"reconnects": 0}

    async def subscribe(self, subject: str, **kwargs: Any) -> _Sub:
        return _Sub()

    def jetstream(self) -> Any:
        async def publish(*args: Any, **kwargs: Any) -> None:
            pass
        return SimpleNamespace(publish=publish)


async def test_a_caller_gone_mid_answer_leaves_the_answer_router_at_once() -> None:
    door = Door(_Nats(), None, AuthThrottle(""), answer_timeout=5)  # type: ignore[arg-type]
    answer = door.answer(AgentRequest(request_id="r1", session_id="s", query="q",
                                      agent_id="a"))
    chunk = ResponseChunk(request_id="r1", seq=0, text="x", kind=ChunkKind.TEXT)
    loop = asyncio.get_running_loop()
    loop.call_later(0.05, lambda: loop.create_task(door.router._deliver(
        SimpleNamespace(subject=response_subject("a", "r1"),  # type: ignore[arg-type]
                        data=encode(chunk)))))
    assert (await anext(answer)).text == "x"
    await answer.aclose()  # the door's handler done with it (the client left)
    # Before the fix the queue stayed until the loop finalized the abandoned `ask`.
    assert door.router._waiting == {}

async def test_bad_keys_bodies_and_models_are_openai_errors_before_the_pipeline(
    served: tuple[ScriptedDoor, str, dict[str, Any]]
) -> None:
    door, base, _ = served
    with pytest.raises(openai.AuthenticationError):
        await client(base, "wrong").models.list()
    bad = [({"model": "intentroute", "messages": [{"role": "user", "content": "q"},
                                                  {"role": "assistant", "content": "a"}]},
            "messages"),
           ({"model": "intentroute", "messages": []}, "messages"),
           ({"model": "intentroute", "messages": [{"role": "user", "content": 5}]},
            "messages")]
    for body, param in bad:
        with pytest.raises(openai.BadRequestError) as raised:
            await client(base).chat.completions.create(**body)  # type: ignore[call-overload]
        assert raised.value.param == param, body
    # A model this door does not serve the agent: OpenAI's 404 model_not_found.
    for model in ("gpt-4o", "intentroute/NOPE", "cloud/big-1"):
        with pytest.raises(openai.NotFoundError) as missing:
            await client(base).chat.completions.create(
                model=model, messages=[{"role": "user", "content": "q"}])
        assert (missing.value.code, missing.value.param) == ("model_not_found", "model")
    async with aiohttp.ClientSession() as http, http.post(
            f"{base}/v1/chat/completions", data=b"{not json",
            headers={"Authorization": "Bearer good"}) as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["code"] == ErrorCode.MALFORMED_JSON
    assert door.asked == []


async def test_a_long_conversation_is_read_past_the_feedback_limit_up_to_two_mib(
    served: tuple[ScriptedDoor, str, dict[str, Any]]
) -> None:
    door, base, _ = served
    door.script = [final(0, "ok")]
    earlier = [{"role": "user", "content": "x" * 100_000},
               {"role": "assistant", "content": "y" * 100_000}]
    answer = await client(base).chat.completions.create(
        model="intentroute", messages=[*earlier, {"role": "user", "content": "q"}])
    assert answer.choices[0].message.content == "ok"
    with pytest.raises(openai.APIStatusError) as refused:
        await client(base).chat.completions.create(
            model="intentroute", messages=[{"role": "user", "content": "z" * 3_000_000}])
    assert refused.value.status_code == 413
    assert refused.value.code == ErrorCode.OVERSIZED_FIELD


async def test_models_lists_the_router_and_one_model_per_route(
    served: tuple[ScriptedDoor, str, dict[str, Any]]
) -> None:
    _, base, _ = served
    ids = [m.id async for m in client(base).models.list()]
    assert ids == ["intentroute", *(f"intentroute/{t.value}" for t in QueryType)]
    model = await client(base).models.retrieve("intentroute/CODE_GENERATION")
    assert model.owned_by == "intentroute"


def chat(messages: list[dict[str, Any]], **fields: Any) -> wire.ChatRequest:
    decoded = wire.decode_chat(wire.msgspec.json.encode({"model": "intentroute",
                                                         "messages": messages, **fields}))
    assert isinstance(decoded, wire.ChatRequest)
    return decoded


def test_the_last_user_message_is_the_query_and_system_and_metadata_the_context() -> None:
    req = wire.to_agent_request(chat(
        [{"role": "system", "content": "plan=pro"},
         {"role": "developer", "content": [{"type": "text", "text": "usage=20%"}]},
         {"role": "user", "content": "first"}, {"role": "assistant", "content": "a"},
         {"role": "user", "content": "second"}],
        metadata={"project": "p1"}, model="intentroute/PLATFORM"),
        session_header="", request_id="r1")
    assert isinstance(req, AgentRequest)
    assert (req.query, req.query_type) == ("second", "PLATFORM")
    assert req.extra_context == "plan=pro\n\nusage=20%\n\nproject: p1"


def test_turns_of_one_conversation_share_a_session_unless_a_header_names_one() -> None:
    one = [{"role": "user", "content": "hello"}]
    two = [*one, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}]
    sessions = {}
    for name, messages, user in (("turn 1", one, None), ("turn 2", two, None),
                                 ("other user", two, "u2")):
        req = wire.to_agent_request(chat(messages, user=user), session_header="",
                                    request_id="r")
        assert isinstance(req, AgentRequest)
        sessions[name] = req.session_id
    assert sessions["turn 1"] == sessions["turn 2"] != sessions["other user"]
    named = wire.to_agent_request(chat(two), session_header="s-9", request_id="r")
    assert isinstance(named, AgentRequest)
    assert named.session_id == "s-9"


async def test_healthz_answers_and_readyz_names_what_is_not_ready(
    served: tuple[ScriptedDoor, str, dict[str, Any]]
) -> None:
    _, base, probes = served
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base}/healthz") as resp:
            assert resp.status == 200
        async with http.get(f"{base}/readyz") as resp:
            assert resp.status == 200
            assert (await resp.json())["checks"] == {"nats": "ok", "postgres": "ok",
                                                     "consumers": "ok"}
        probes["pool"].down, probes["consuming"] = True, False
        async with http.get(f"{base}/readyz") as resp:
            assert resp.status == 503
            checks = (await resp.json())["checks"]
        assert checks["postgres"].startswith("unreachable")
        assert checks["consumers"] == "not pulling"
        async with http.get(f"{base}/healthz") as resp:
            assert resp.status == 200
