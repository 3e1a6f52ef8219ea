"""AVAP Parser gRPC service (avap.parser.v1.AvapParser) over the in-process parser.

Run it with `intentroute parser [--host H] [--port P] [--strict]`. The same server
answers `grpc.health.v1.Health` (grpcio-health-checking) for "" and for
`avap.parser.v1.AvapParser`: SERVING once it listens (the parser is in process: nothing
else to wait for), NOT_SERVING from the start of a graceful stop.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.parser.avap import validate
from shared.grpc import avap_parser_pb2, avap_parser_pb2_grpc

log = logging.getLogger("intentroute.parser")

# Generated answers are small; this only stops a runaway request from pinning the loop
# (parsing is synchronous, about 10 µs per line).
MAX_CODE_CHARS = 256 * 1024
GRACE_SECONDS = 2.0
PARSER_SERVICE = avap_parser_pb2.DESCRIPTOR.services_by_name["AvapParser"].full_name


class AvapParserService(avap_parser_pb2_grpc.AvapParserServicer):
    def __init__(self, *, default_strict: bool = False) -> None:
        # proto3 cannot tell an unset bool from false, so a strict server forces strict.
        self._default_strict = default_strict

    async def Validate(
        self,
        request: avap_parser_pb2.ValidateRequest,
        context: grpc.aio.ServicerContext[
            avap_parser_pb2.ValidateRequest, avap_parser_pb2.ValidateResponse
        ],
    ) -> avap_parser_pb2.ValidateResponse:
        if len(request.code) > MAX_CODE_CHARS:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"code is {len(request.code)} characters; the limit is {MAX_CODE_CHARS}",
            )
        result = validate(request.code, strict=request.strict or self._default_strict)
        return avap_parser_pb2.ValidateResponse(
            valid=result.valid,
            trace=[
                avap_parser_pb2.TraceLine(
                    line=t.line,
                    column=t.column,
                    code=t.code,
                    message=t.message,
                    suggestion=t.suggestion,
                )
                for t in result.trace
            ],
        )


async def serve(
    host: str = "127.0.0.1",
    port: int = 50051,
    *,
    default_strict: bool = False,
    servicer: AvapParserService | None = None,
    health_servicer: health.aio.HealthServicer | None = None,
) -> grpc.aio.Server:
    """Start the server and return it; the caller awaits `wait_for_termination()`.

    `servicer` lets tests plug in a subclass (e.g. a deliberately slow one);
    `health_servicer`, the caller's, to say NOT_SERVING before it stops the server.
    """
    server = grpc.aio.server()
    # The generated registration function is untyped (grpc_tools emits no annotations).
    avap_parser_pb2_grpc.add_AvapParserServicer_to_server(  # type: ignore[no-untyped-call]
        servicer or AvapParserService(default_strict=default_strict), server
    )
    health_servicer = health_servicer or health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind the AVAP parser to {host}:{port}")
    await server.start()
    for service in ("", PARSER_SERVICE):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    log.info("AVAP parser listening on %s:%d (strict=%s)", host, bound, default_strict)
    return server


async def run(host: str = "127.0.0.1", port: int = 50051, *, default_strict: bool = False) -> None:
    """Serve until cancelled, then stop gracefully (in-flight calls get GRACE_SECONDS)."""
    health_servicer = health.aio.HealthServicer()
    server = await serve(host, port, default_strict=default_strict,
                         health_servicer=health_servicer)
    try:
        await server.wait_for_termination()
    finally:
        await health_servicer.enter_graceful_shutdown()
        # Shield the stop so a cancellation still waits for in-flight calls to finish.
        await asyncio.shield(server.stop(GRACE_SECONDS))
