"""`grpc.health.v1` and reflection on a gateway gRPC server on loopback (fake agents and
readiness, no bus): NOT_SERVING until ready, SERVING then, NOT_SERVING once stopping;
reflection lists the services with their descriptors (grpcio-reflection's client); a
junk body to an open service is INVALID_ARGUMENT with nothing logged. The parser's server
answers SERVING once it listens."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from services.doors.grpc_server import start_grpc
from services.doors.throttle import AuthThrottle
from services.parser.server import serve
from shared.auth.ports import AgentInfo, HashGate
from testkit.fakes import LocalDoor

ENGINE = "intentroute.agent.v1.AssistanceEngine"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class NoAgents:
    async def verify_token(self, token: str, *,
                           before_hashing: HashGate | None = None) -> AgentInfo | None:
        return None


class Readiness:
    def __init__(self) -> None:
        self.ready = False

    async def __call__(self) -> bool:
        return self.ready


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[str, Readiness, Any]]:
    from intentroute.stack import free_port

    ready = Readiness()
    listen = f"127.0.0.1:{free_port()}"
    srv = await start_grpc(LocalDoor(NoAgents(), throttle=AuthThrottle("1000/minute")), listen,
                           ready=ready)
    try:
        yield listen, ready, srv
    finally:
        await srv.stop(None)


async def test_health_follows_readiness_and_says_not_serving_once_stopping(
    gateway: tuple[str, Readiness, Any],
) -> None:
    listen, ready, srv = gateway
    async with grpc.aio.insecure_channel(listen) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", ENGINE):
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == NOT_SERVING
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=ENGINE))
        assert (await watch.read()).status == NOT_SERVING
        ready.ready = True
        assert (await asyncio.wait_for(watch.read(), 10)).status == SERVING
        assert (await stub.Check(health_pb2.HealthCheckRequest())).status == SERVING
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"))
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        await srv.health.stop()  # the first step of `stop`: probes see it before the end
        assert (await asyncio.wait_for(watch.read(), 10)).status == NOT_SERVING
        ready.ready = True  # no way back once stopping
        assert (await stub.Check(health_pb2.HealthCheckRequest())).status == NOT_SERVING
        watch.cancel()


def _reflected(listen: str) -> tuple[list[str], list[str]]:
    with grpc.insecure_channel(listen) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = sorted(database.get_services())
        pool = DescriptorPool(database)
        methods = [m.name for m in pool.FindServiceByName(ENGINE).methods]
    return services, methods


async def test_reflection_lists_the_services_with_their_descriptors(
    gateway: tuple[str, Readiness, Any],
) -> None:
    listen, _, _ = gateway
    services, methods = await asyncio.to_thread(_reflected, listen)
    assert services == sorted([ENGINE, "grpc.health.v1.Health",
                               "grpc.reflection.v1alpha.ServerReflection"])
    assert set(methods) >= {"AskAgent", "AskAgentStream", "Feedback"}


async def test_a_junk_body_to_an_open_service_is_invalid_argument_and_not_logged(
    gateway: tuple[str, Readiness, Any], caplog: pytest.LogCaptureFixture,
) -> None:
    listen, _, _ = gateway
    caplog.set_level(logging.DEBUG)
    async with grpc.aio.insecure_channel(listen) as channel:
        check: Any = channel.unary_unary("/grpc.health.v1.Health/Check")
        watch: Any = channel.unary_stream("/grpc.health.v1.Health/Watch")
        reflect: Any = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
        for call in (check(b"\xff\xff\xff\xff"), _first(watch(b"\xff\xff\xff\xff")),
                     _first(reflect(iter([b"\x0a\x02\xff\xfe"])))):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # A good body still gets its answer after the junk.
        good = health_pb2.HealthCheckRequest().SerializeToString()
        assert health_pb2.HealthCheckResponse.FromString(await check(good)).status in (
            SERVING, NOT_SERVING)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


async def _first(stream: Any) -> Any:
    async for item in stream:
        return item
    return None


async def test_the_parser_answers_serving_once_it_listens() -> None:
    from intentroute.stack import free_port

    port = free_port()
    server = await serve("127.0.0.1", port)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for service in ("", "avap.parser.v1.AvapParser"):
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=service))
                assert reply.status == SERVING
    finally:
        await server.stop(None)
