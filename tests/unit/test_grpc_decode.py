"""gRPC bodies that do not decode, at a gateway gRPC server on loopback (fake agents, no
bus): the token is checked first (UNAUTHENTICATED without a right one), then the body is
INVALID_ARGUMENT; grpc logs no traceback and nothing else is logged for them."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError

from services.doors.grpc_decode import DeferDecodeErrors, Undecodable, deferring
from services.doors.grpc_server import start_grpc
from services.doors.throttle import AuthThrottle
from shared.auth.ports import AgentInfo, HashGate
from shared.grpc import agent_pb2
from testkit.fakes import LocalDoor

SERVICE = "/intentroute.agent.v1.AssistanceEngine/"
# Not a protobuf message: a truncated varint, and a string field that is not UTF-8.
JUNK = (b"\xff\xff\xff\xff", b"\x0a\x02\xff\xfe")


class RecordingAgents:
    """`<agent>.good` tokens are valid; records every token checked."""

    def __init__(self) -> None:
        self.checked: list[str] = []

    async def verify_token(self, token: str, *,
                           before_hashing: HashGate | None = None) -> AgentInfo | None:
        self.checked.append(token)
        agent, _, secret = token.partition(".")
        return AgentInfo(agent) if secret == "good" else None


@pytest.fixture
async def server() -> AsyncIterator[tuple[grpc.aio.Channel, RecordingAgents]]:
    from intentroute.stack import free_port

    agents = RecordingAgents()
    listen = f"127.0.0.1:{free_port()}"
    srv = await start_grpc(LocalDoor(agents, throttle=AuthThrottle("1000/minute")), listen)
    async with grpc.aio.insecure_channel(listen) as channel:
        yield channel, agents
    await srv.stop(None)


async def call(channel: grpc.aio.Channel, method: str, body: bytes,
               token: str | None) -> grpc.StatusCode:
    raw: Any = channel.unary_unary(SERVICE + method)  # bytes in, bytes out
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    try:
        await raw(body, metadata=metadata)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("method", ["AskAgent", "Feedback"])
async def test_a_body_that_does_not_decode_is_invalid_argument_after_the_token(
        server: tuple[grpc.aio.Channel, RecordingAgents], method: str,
        caplog: pytest.LogCaptureFixture) -> None:
    channel, agents = server
    caplog.set_level(logging.DEBUG)
    for body in JUNK:
        assert await call(channel, method, body, None) == grpc.StatusCode.UNAUTHENTICATED
        assert await call(channel, method, body, "a.bad") == grpc.StatusCode.UNAUTHENTICATED
        assert await call(channel, method, body, "a.good") == grpc.StatusCode.INVALID_ARGUMENT
    assert agents.checked == ["a.bad", "a.good"] * len(JUNK)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    # A body that decodes goes past the decoding (here: to the feedback's own checks).
    good = agent_pb2.FeedbackRequest(request_id="r-1", outcome="meh").SerializeToString()
    assert await call(channel, "Feedback", good, "a.good") == grpc.StatusCode.INVALID_ARGUMENT
    assert await call(channel, "Feedback", good, "a.bad") == grpc.StatusCode.UNAUTHENTICATED


async def test_a_flood_of_junk_writes_no_lines(
        server: tuple[grpc.aio.Channel, RecordingAgents],
        caplog: pytest.LogCaptureFixture) -> None:
    channel, _ = server
    caplog.set_level(logging.DEBUG)
    codes = {await call(channel, "AskAgentStream", JUNK[n % 2], None) for n in range(200)}
    assert codes == {grpc.StatusCode.UNAUTHENTICATED}
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_the_deserializer_defers_only_what_does_not_decode() -> None:
    decode = deferring(agent_pb2.AgentRequest.FromString)
    ok = agent_pb2.AgentRequest(agent_id="a", query="q")
    assert decode(ok.SerializeToString()) == ok
    bad = decode(JUNK[0])
    assert isinstance(bad, Undecodable)
    assert (bad.size, bad.problem) == (4, DecodeError.__name__)
    assert isinstance(DeferDecodeErrors(), grpc.aio.ServerInterceptor)
