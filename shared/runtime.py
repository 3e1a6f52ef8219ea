"""Composition root shared by the workers: connection + stages + lifespan, same shape everywhere."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Protocol, TypeVar

from faststream import FastStream
from opentelemetry.trace import TracerProvider

from shared.bus import Bus, connect_and_declare, make_broker
from shared.consumer import Stage, StageConsumer
from shared.settings import CommonSettings
from shared.telemetry import tracer_for


class Closable(Protocol):
    async def close(self) -> None: ...


D = TypeVar("D", bound=Closable)


def build_app(
    *,
    common: CommonSettings,
    stages: list[Stage[D]],
    make_deps: Callable[[Bus], Awaitable[D]],
    tracer_provider: TracerProvider | None = None,
    on_ready: Callable[[D], Awaitable[None]] | None = None,
) -> FastStream:
    """The worker's app: its lifespan connects, declares the streams, builds the
    worker's clients and models once, then starts one consumer per stage; on the way
    out the consumers stop pulling and finish what they hold before deps close."""
    logging.basicConfig(
        level=common.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    broker = make_broker(common)
    app = FastStream(broker, logger=logging.getLogger("intentroute.app"))
    tracer = tracer_for("intentroute.bus", tracer_provider) if tracer_provider else None

    @asynccontextmanager
    async def lifespan() -> AsyncIterator[None]:
        await connect_and_declare(broker, common)
        bus = Bus(broker.config.connection_state.connection, tracing=tracer is not None)
        deps = await make_deps(bus)
        consumers = [
            StageConsumer(bus.nc, stage.spec, stage.bind(deps), tracer=tracer)
            for stage in stages
        ]
        try:
            for consumer in consumers:
                await consumer.start()
            if on_ready is not None:
                await on_ready(deps)
            # Models, clients and imports are built: keep them out of every collection,
            # and collect young objects less often (each message allocates many).
            gc.freeze()
            gc.set_threshold(20_000, 50, 100)
            yield
        finally:
            for consumer in consumers:
                await consumer.stop()
            await deps.close()

    app.lifespan_context = lambda *_, **__: lifespan()
    return app
