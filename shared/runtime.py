"""Composition root shared by the workers: the same lifecycle for every stage.

FastStream runs the application: its broker owns the connection (connect, reconnect,
drain). The stage consumers (`shared.consumer.StageConsumer`, the lean pull consumer on
the hot path) are a component of that application, driven by its hooks:

* after start-up (the broker is connected): declare the streams, build the tracer, bus,
  store and the worker's own clients and models once, then start one consumer per stage;
* on shutdown (before the broker drains): the consumers stop pulling and finish what
  they hold, while the connection can still publish their answers;
* after shutdown: whatever was opened is closed, in reverse order.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from faststream import FastStream
from faststream.nats import NatsBroker
from nats.aio.client import Client
from opentelemetry.trace import TracerProvider

from shared.admission import Admission
from shared.bus import Bus, make_broker, prepare_streams
from shared.consumer import StageConsumer
from shared.settings import CommonSettings
from shared.stage import Stage, StageDeps
from shared.store.stores import Store
from shared.telemetry import build_tracer_provider, tracer_for

D = TypeVar("D", bound=StageDeps)


@dataclass(frozen=True)
class Wiring:
    """What the runtime built for a worker, concretely typed for its `make_deps`: the
    common dependencies (`base`, what handlers see), the connection and the store."""

    base: StageDeps
    nc: Client
    store: Store


MakeDeps = Callable[[Wiring], Awaitable[D]]


class Worker(Generic[D]):
    """One worker process's stages, their dependencies and their consumers."""

    def __init__(
        self,
        broker: NatsBroker,
        *,
        service: str,
        common: CommonSettings,
        stages: Sequence[Stage[Any, D]],
        make_deps: MakeDeps[D],
        tracer_provider: TracerProvider | None,
    ) -> None:
        self.broker = broker
        self.service = service
        self.common = common
        self.stages = stages
        self._make_deps = make_deps
        self._provider = tracer_provider
        self.deps: D | None = None
        self.consumers: list[StageConsumer] = []

    async def start(self) -> None:
        if self.common.nats_authenticated and not self.common.admission_key:
            raise RuntimeError(
                "INTENTROUTE_ADMISSION_KEY is not set: with NATS authentication on, every "
                "worker needs the deployment's admission key (`intentroute up` generates "
                "one in its state directory)")
        nc = await self.broker.connect()
        await prepare_streams(nc.jetstream(), self.common)
        bus = Bus(nc, tracing=self._provider is not None)
        tracer = tracer_for(f"intentroute.{self.service}", self._provider)
        store = await Store.connect(self.common.database_url, tracer=tracer)
        base = StageDeps(bus=bus, store=store, tracer=tracer,
                         admission=Admission(self.common.admission_key.encode()))
        base.exits.push_async_callback(store.close)
        try:
            self.deps = await self._make_deps(Wiring(base=base, nc=nc, store=store))
        except BaseException:
            await base.close()
            raise
        consumer_tracer = (
            tracer_for("intentroute.bus", self._provider) if self._provider else None
        )
        self.consumers = [
            StageConsumer(nc, stage.spec, stage.bind(self.deps), tracer=consumer_tracer)
            for stage in self.stages
        ]
        for consumer in self.consumers:
            await consumer.start()
        # Models, clients and imports are built: keep them out of every collection,
        # and collect young objects less often (each message allocates many).
        gc.freeze()
        gc.set_threshold(20_000, 50, 100)

    async def stop(self) -> None:
        """Stop pulling; in-flight handlers finish while the connection is still up."""
        for consumer in self.consumers:
            await consumer.stop()

    async def close(self) -> None:
        if self.deps is not None:
            await self.deps.close()
            self.deps = None


def build_app(
    *,
    service: str,
    common: CommonSettings,
    stages: Sequence[Stage[Any, D]],
    make_deps: MakeDeps[D],
    tracer_provider: TracerProvider | None = None,
) -> FastStream:
    """The worker's FastStream application; `make_deps` turns what the runtime built
    (bus, store, tracer, exit stack, connection) into what its stages need."""
    logging.basicConfig(
        level=common.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    provider = tracer_provider or build_tracer_provider(
        f"intentroute-{service}", common.otlp_endpoint
    )
    broker = make_broker(common)
    worker = Worker(broker, service=service, common=common, stages=stages,
                    make_deps=make_deps, tracer_provider=provider)
    return FastStream(
        broker,
        logger=logging.getLogger("intentroute.app"),
        after_startup=[worker.start],
        on_shutdown=[worker.stop],
        after_shutdown=[worker.close],
    )

