"""Gateway worker: settings -> stage -> deps (agent records, gRPC listener)."""

from __future__ import annotations

from faststream import FastStream
from opentelemetry.trace import TracerProvider

from services.gateway.grpc_server import start_grpc
from services.gateway.handlers import GatewayDeps, build_stage
from services.gateway.settings import GatewaySettings
from shared.identity import CachedAgents
from shared.runtime import Wiring, build_app


def create_app(
    settings: GatewaySettings | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
) -> FastStream:
    settings = settings or GatewaySettings.from_env()
    tls = None
    if settings.tls_cert and settings.tls_key:
        tls = (settings.tls_key.read_bytes(), settings.tls_cert.read_bytes())

    async def make_deps(wiring: Wiring) -> GatewayDeps:
        agents = CachedAgents(wiring.store.agent, ttl=settings.agent_cache_ttl)
        if settings.grpc_listen:
            server = await start_grpc(wiring.nc, settings.grpc_listen, agents,
                                      answer_timeout=settings.answer_timeout,
                                      tls=tls)
            wiring.base.exits.push_async_callback(server.stop, 2.0)
        return GatewayDeps(**wiring.base.parts(), agents=agents)

    return build_app(service="gateway", common=settings.common, stages=[build_stage(settings)],
                     make_deps=make_deps, tracer_provider=tracer_provider)
