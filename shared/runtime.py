"""Composition root shared by the workers: broker + router + lifespan, same shape everywhere."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Protocol, TypeVar

from faststream import FastStream
from faststream.nats import NatsBroker, NatsRouter
from opentelemetry.trace import TracerProvider

from shared.bus import connect_and_declare, make_broker
from shared.settings import CommonSettings


class Closable(Protocol):
    async def close(self) -> None: ...


D = TypeVar("D", bound=Closable)


def build_app(
    *,
    common: CommonSettings,
    routers: list[NatsRouter],
    make_deps: Callable[[NatsBroker], Awaitable[D]],
    tracer_provider: TracerProvider | None = None,
    on_ready: Callable[[D], Awaitable[None]] | None = None,
) -> FastStream:
    """Broker with the worker's routers; the lifespan connects, declares streams and
    builds the worker's clients and models once, before any message is handled."""
    logging.basicConfig(
        level=common.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    broker = make_broker(common, tracer_provider=tracer_provider)
    for router in routers:
        broker.include_router(router)
    app = FastStream(broker, logger=logging.getLogger("intentroute.app"))

    @asynccontextmanager
    async def lifespan() -> AsyncIterator[None]:
        await connect_and_declare(broker, common)
        deps = await make_deps(broker)
        app.context.set_global("deps", deps)
        if on_ready is not None:
            await on_ready(deps)
        try:
            yield
        finally:
            await deps.close()

    app.lifespan_context = lambda *_, **__: lifespan()
    return app
