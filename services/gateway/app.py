"""Gateway worker: settings -> stage -> deps (gRPC listener)."""

from __future__ import annotations

from faststream import FastStream
from opentelemetry.trace import TracerProvider

from services.gateway.grpc_server import start_grpc
from services.gateway.handlers import build_stage
from services.gateway.settings import GatewaySettings
from shared.bus import Bus
from shared.runtime import build_app
from shared.stage import StageDeps


def create_app(
    settings: GatewaySettings | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
) -> FastStream:
    settings = settings or GatewaySettings.from_env()

    async def make_deps(base: StageDeps) -> StageDeps:
        if settings.grpc_listen:
            assert isinstance(base.bus, Bus)
            server = await start_grpc(base.bus.nc, settings.grpc_listen,
                                      answer_timeout=settings.answer_timeout)
            base.exits.push_async_callback(server.stop, 2.0)
        return base

    return build_app(service="gateway", common=settings.common, stages=[build_stage(settings)],
                     make_deps=make_deps, tracer_provider=tracer_provider)
