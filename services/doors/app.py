"""Doors worker: settings -> agents' records -> the door into the pipeline -> gRPC and
HTTP faces (bootstrap.py). A client of the pipeline: no stage, no stream of its own."""

from __future__ import annotations

from faststream import FastStream
from opentelemetry.trace import TracerProvider

from services.doors import bootstrap
from services.doors.health import Readiness
from services.doors.settings import DoorsSettings
from shared.contracts.request import SUBJECTS
from shared.runtime.micro import Endpoint
from shared.runtime.worker import ClientWiring, build_client_app


def create_app(settings: DoorsSettings | None = None, *,
               tracer_provider: TracerProvider | None = None) -> FastStream:
    settings = settings or DoorsSettings.from_env()

    async def serve(wiring: ClientWiring) -> None:
        pool = await bootstrap.open_pool(settings, wiring.exits)
        agents = bootstrap.agent_records(settings, pool, wiring.exits)
        door = bootstrap.door(settings, wiring, agents)
        # One readiness for both faces: HTTP's /readyz and gRPC's health service.
        signals = wiring.signals
        readiness = Readiness(wiring.nc, pool, lambda: signals.consuming)
        await bootstrap.serve_grpc(settings, door, readiness, wiring.exits)
        await bootstrap.serve_http(settings, wiring, door, readiness, pool, wiring.exits)

    return build_client_app(service="doors", common=settings.common, serve=serve,
                            endpoints=[Endpoint(bootstrap.ENDPOINT, SUBJECTS)],
                            tracer_provider=tracer_provider)
