"""The AVAP parser over real gRPC: server, GrpcParserClient and GuardedParser."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import grpc
import pytest

from services.parser.server import AvapParserService, run, serve
from services.validator.breaker import BreakerState, CircuitBreaker
from services.validator.parser_client import (
    GrpcParserClient,
    GuardedParser,
    ParserUnavailableError,
    grpc_target,
)
from services.validator.ports import CheckStatus, ParseOutcome
from shared.contracts.parser import TraceLine
from shared.grpc import avap_parser_pb2

pytestmark = pytest.mark.integration

VALID = "addParam(password, pwd)\nencodeSHA256(pwd, hashed)\naddResult(hashed)"
INVALID = "addParam(password, pwd)\n  getSHA256(pwd, hashed)\naddResult(hashed)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def parser_url() -> AsyncIterator[str]:
    port = free_port()
    server = await serve("127.0.0.1", port)
    yield f"grpc://127.0.0.1:{port}"
    await server.stop(None)


class SlowService(AvapParserService):
    """Holds every call until released: a parser that stopped answering."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def Validate(
        self,
        request: avap_parser_pb2.ValidateRequest,
        context: grpc.aio.ServicerContext[
            avap_parser_pb2.ValidateRequest, avap_parser_pb2.ValidateResponse
        ],
    ) -> avap_parser_pb2.ValidateResponse:
        self.entered.set()
        await self.release.wait()
        return await super().Validate(request, context)


class CountingClient:
    """Wraps a real client and counts the calls that reach it."""

    def __init__(self, inner: GrpcParserClient) -> None:
        self.inner = inner
        self.calls = 0

    async def validate(self, code: str, *, strict: bool = False) -> ParseOutcome:
        self.calls += 1
        return await self.inner.validate(code, strict=strict)


@contextlib.asynccontextmanager
async def client_for(url: str, *, timeout: float) -> AsyncIterator[GrpcParserClient]:
    client = GrpcParserClient(url, timeout=timeout)
    try:
        yield client
    finally:
        await client.close()


async def test_valid_program_over_grpc(parser_url: str) -> None:
    async with client_for(parser_url, timeout=5) as client:
        outcome = await client.validate(VALID)
    assert outcome == ParseOutcome(valid=True, trace=())


async def test_invalid_trace_fields_survive_the_wire(parser_url: str) -> None:
    async with client_for(parser_url, timeout=5) as client:
        outcome = await client.validate(INVALID)
    assert not outcome.valid
    assert outcome.trace == (
        TraceLine(
            line=2,
            column=3,
            code="UNKNOWN_COMMAND",
            message="unknown command 'getSHA256' — expected known identifier",
            suggestion="encodeSHA256",
        ),
    )


async def test_strict_flag_is_honoured(parser_url: str) -> None:
    lite = "total = 40 + 2\naddResult(total)"
    async with client_for(parser_url, timeout=5) as client:
        assert (await client.validate(lite, strict=False)).valid
        strict = await client.validate(lite, strict=True)
    assert [t.code for t in strict.trace] == ["INVALID_ASSIGNMENT"]


async def test_server_default_strict_forces_strict() -> None:
    port = free_port()
    server = await serve("127.0.0.1", port, default_strict=True)
    try:
        async with client_for(f"127.0.0.1:{port}", timeout=5) as client:
            assert not (await client.validate("total = 40 + 2", strict=False)).valid
    finally:
        await server.stop(None)


async def test_client_timeout_against_a_slow_parser() -> None:
    port = free_port()
    slow = SlowService()
    server = await serve("127.0.0.1", port, servicer=slow)
    try:
        async with client_for(f"127.0.0.1:{port}", timeout=0.2) as client:
            with pytest.raises(ParserUnavailableError) as info:
                await client.validate(VALID)
        assert slow.entered.is_set()
        assert info.value.status is grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        slow.release.set()
        await server.stop(None)


async def test_stopped_server_is_unavailable() -> None:
    port = free_port()
    server = await serve("127.0.0.1", port)
    async with client_for(f"127.0.0.1:{port}", timeout=2) as client:
        assert (await client.validate(VALID)).valid
        await server.stop(None)
        with pytest.raises(ParserUnavailableError) as info:
            await client.validate(VALID)
    assert info.value.status is grpc.StatusCode.UNAVAILABLE


async def test_guarded_parser_opens_after_three_failures_then_makes_no_call() -> None:
    now = [0.0]
    breaker = CircuitBreaker(3, 30, clock=lambda: now[0])
    inner = GrpcParserClient(f"127.0.0.1:{free_port()}", timeout=1)  # nothing listens there
    client = CountingClient(inner)
    guarded = GuardedParser(client, breaker, timeout=1)
    try:
        for _ in range(3):
            result = await guarded.check(VALID)
            assert result.status is CheckStatus.UNAVAILABLE
        assert breaker.state is BreakerState.OPEN
        assert client.calls == 3
        for _ in range(3):
            assert (await guarded.check(VALID)).reason == "circuit_open"
        assert client.calls == 3
    finally:
        await inner.close()


async def test_guarded_parser_verdicts_from_a_live_server(parser_url: str) -> None:
    async with client_for(parser_url, timeout=5) as client:
        guarded = GuardedParser(client, timeout=5)
        assert (await guarded.check(VALID)).status is CheckStatus.VALID
        invalid = await guarded.check(INVALID)
    assert invalid.status is CheckStatus.INVALID
    assert invalid.trace[0].suggestion == "encodeSHA256"


async def test_run_serves_until_cancelled_then_stops() -> None:
    port = free_port()
    task = asyncio.create_task(run("127.0.0.1", port))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await asyncio.wait_for(channel.channel_ready(), timeout=10)
    async with client_for(f"127.0.0.1:{port}", timeout=5) as client:
        assert (await client.validate(VALID)).valid
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(ParserUnavailableError):
            await client.validate(VALID)


def test_url_forms() -> None:
    assert grpc_target("grpc://parser:50051") == "parser:50051"
    assert grpc_target("parser:50051") == "parser:50051"
    with pytest.raises(ValueError, match="expected grpc://host:port"):
        grpc_target("http://parser:50051")
    with pytest.raises(ValueError, match="expected grpc://host:port"):
        grpc_target("")
