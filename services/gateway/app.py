"""Gateway worker: settings -> stage -> lifespan (store, gRPC listener)."""

from __future__ import annotations

from faststream import FastStream
from opentelemetry.trace import TracerProvider

from services.gateway.grpc_server import start_grpc
from services.gateway.handlers import GatewayDeps, build_stage
from services.gateway.settings import GatewaySettings
from shared.bus import Bus
from shared.runtime import build_app
from shared.store.stores import Store
from shared.telemetry import build_tracer_provider, tracer_for


class _GatewayRuntime(GatewayDeps):
    def __init__(self, bus: Bus, store: Store, grpc_server: object | None) -> None:
        super().__init__(bus, store)
        self.grpc_server = grpc_server

    async def close(self) -> None:
        if self.grpc_server is not None:
            await self.grpc_server.stop(grace=2.0)  # type: ignore[attr-defined]
        await super().close()


def create_app(
    settings: GatewaySettings | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
) -> FastStream:
    settings = settings or GatewaySettings.from_env()
    provider = tracer_provider or build_tracer_provider(
        "intentroute-gateway", settings.common.otlp_endpoint
    )

    async def make_deps(bus: Bus) -> GatewayDeps:
        store = await Store.connect(
            settings.common.database_url, tracer=tracer_for("intentroute.gateway", provider)
        )
        grpc_server = None
        if settings.grpc_listen:
            grpc_server = await start_grpc(
                bus.nc, settings.grpc_listen, answer_timeout=settings.answer_timeout
            )
        return _GatewayRuntime(bus, store, grpc_server)

    return build_app(
        common=settings.common,
        stages=[build_stage(settings)],
        make_deps=make_deps,
        tracer_provider=provider,
    )
