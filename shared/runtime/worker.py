"""Composition root shared by the workers: the same lifecycle for every stage.

FastStream runs the application: its broker owns the connection (connect, reconnect,
drain). The stage consumers (`shared.runtime.consumer.StageConsumer`, the lean pull consumer on
the hot path) are a component of that application, driven by its hooks:

* after start-up (the broker is connected): declare the streams, build the tracer, bus,
  store and the worker's own clients and models once, then start one consumer per stage,
  and register the worker on the NATS services API (`shared.runtime.micro`: a replica that
  answers `$SRV.PING` is consuming) and, when configured, export its metrics
  (`shared.runtime.metrics`: Prometheus, OTLP); both read the same counts
  (`shared.runtime.signals`);
* on shutdown (before the broker drains): the worker leaves the services API, the
  consumers stop pulling and finish what they hold, while the connection can still
  publish their answers;
* after shutdown: whatever was opened is closed, in reverse order, and the spans and
  metrics still held are exported.

Traces and metrics go where the standard OTEL_* variables say (shared.runtime.telemetry).

A worker that reads no stage (a client of the pipeline: the doors) has the same
lifecycle without streams, store or consumers (`build_client_app`): connect, build what
it serves once (`serve`), register on the services API with the endpoints it counts,
export its metrics; on shutdown leave the services API; after it, close what `serve`
opened, in reverse order.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from faststream import FastStream
from faststream.nats import NatsBroker
from nats.aio.client import Client
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.trace import Tracer, TracerProvider

from shared.auth.admission import Admission
from shared.common.otel import PROMETHEUS_PORT
from shared.common.settings import CommonSettings
from shared.runtime.bus import Bus
from shared.runtime.consumer import Handler, OnHandled, StageConsumer, StageSpec
from shared.runtime.logs import configure_logging
from shared.runtime.metrics import Metrics
from shared.runtime.micro import Endpoint, StageService, service_name
from shared.runtime.row_queue import AnsweringStore, row_writer
from shared.runtime.signals import StageStats, WorkerSignals
from shared.runtime.stage import StageDeps
from shared.runtime.streams import make_broker, prepare_streams
from shared.runtime.telemetry import (
    build_tracer_provider,
    metric_reader_factories,
    tracer_for,
    worker_resource,
)
from shared.store.stores import Store

log = logging.getLogger("intentroute.app")

D = TypeVar("D", bound=StageDeps)
D_contra = TypeVar("D_contra", bound=StageDeps, contravariant=True)


class Consumes(Protocol[D_contra]):
    """What a worker reads through a durable consumer: its delivery settings and the
    handler it binds to the worker's dependencies (a `shared.runtime.stage.Stage`, or another
    consumer of the worker such as the gateway's feedback one)."""

    @property
    def spec(self) -> StageSpec: ...

    def bind(self, deps: D_contra) -> Handler: ...


@dataclass(frozen=True)
class Wiring:
    """What the runtime built for a worker, concretely typed for its `make_deps`: the
    common dependencies (`base`, what handlers see), the connection, the store, and the
    signals the worker exports (a service registers its breakers there)."""

    base: StageDeps
    nc: Client
    store: Store
    signals: WorkerSignals


MakeDeps = Callable[[Wiring], Awaitable[D]]


class MakeConsumer(Protocol[D_contra]):
    """Builds the consumer of one stage instead of the plain `StageConsumer` (the
    gateway's fair reader of `agent.request.*`), given the worker's dependencies."""

    def __call__(self, nc: Client, spec: StageSpec, handler: Handler, deps: D_contra, *,
                 tracer: Tracer | None, stats: StageStats,
                 on_handled: OnHandled | None) -> StageConsumer: ...


def start_line(service: str, specs: Sequence[StageSpec]) -> str:
    """The worker's one start line: its name, and each stream with its consumers."""
    streams: dict[str, list[str]] = {}
    for spec in specs:
        streams.setdefault(spec.stream, []).append(spec.durable)
    reading = "; ".join(f"stream {stream} consumer {', '.join(durables)}"
                        for stream, durables in streams.items())
    return f"worker {service} started: {reading or 'no stage'}"


class Worker(Generic[D]):
    """One worker process's stages, their dependencies and their consumers."""

    def __init__(
        self,
        broker: NatsBroker,
        *,
        service: str,
        common: CommonSettings,
        stages: Sequence[Consumes[D]],
        make_deps: MakeDeps[D],
        tracer_provider: TracerProvider | None,
        consumers: Mapping[str, MakeConsumer[D]] | None = None,
        metric_readers: Sequence[Callable[[], MetricReader]] = (),
        owns_provider: bool = False,
    ) -> None:
        """`metric_readers`: the pushing exporters' readers, made at start;
        `owns_provider`: the worker built its tracer provider (and shuts it down)."""
        self.broker = broker
        self.service = service
        self.common = common
        self.stages = stages
        self._make_deps = make_deps
        self._provider = tracer_provider
        self._owns_provider = owns_provider
        self._metric_readers = metric_readers
        self._make_consumer = dict(consumers or {})
        self.deps: D | None = None
        self.consumers: list[StageConsumer] = []
        self.row_writer: StageConsumer | None = None
        self.signals = WorkerSignals(service_name(service))
        self.metrics: Metrics | None = None
        self.service_api: StageService | None = None

    async def start(self) -> None:
        if self.common.nats_authenticated and not self.common.admission_key:
            raise RuntimeError(
                "INTENTROUTE_ADMISSION_KEY is not set: with NATS authentication on, every "
                "worker needs the deployment's admission key (`intentroute up` generates "
                "one in its state directory)")
        nc = await self.broker.connect()
        await prepare_streams(nc.jetstream(), self.common)
        bus = Bus(nc, tracing=self._provider is not None,
                  claim_key=self.common.admission_key.encode())
        tracer = tracer_for(f"intentroute.{self.service}", self._provider)
        store = await Store.connect(self.common.database_url, tracer=tracer,
                                    implicit_feedback=self.common.accounting)
        # Turn rows never hold an answer back on an absent Postgres: queued on the bus
        # instead, written by this worker's row writer (shared.runtime.row_queue).
        answering = AnsweringStore(store, nc.jetstream(),
                                   read_wait=self.common.store_read_wait)
        self.row_writer = row_writer(nc, store, answering, ack_wait=self.common.ack_wait)
        base = StageDeps(bus=bus, store=answering, tracer=tracer,
                         admission=Admission(self.common.admission_key.encode()))
        base.exits.push_async_callback(store.close)
        try:
            self.deps = await self._make_deps(
                Wiring(base=base, nc=nc, store=store, signals=self.signals))
        except BaseException:
            await base.close()
            raise
        consumer_tracer = (
            tracer_for("intentroute.bus", self._provider) if self._provider else None
        )
        metadata: dict[str, str] = {}
        self.metrics = self._start_metrics()
        if self.metrics is not None and self.metrics.serve():
            metadata["metrics"] = self.metrics.address
        metrics = self.metrics
        deps = self.deps
        self.consumers = []
        for stage in self.stages:
            durable = stage.spec.durable
            make = self._make_consumer.get(durable)
            kwargs: dict[str, Any] = {
                "tracer": consumer_tracer, "stats": self.signals.stage(durable),
                "on_handled": metrics.on_handled(durable) if metrics else None}
            self.consumers.append(
                make(nc, stage.spec, stage.bind(deps), deps, **kwargs) if make is not None
                else StageConsumer(nc, stage.spec, stage.bind(deps), **kwargs))
        for consumer in self.consumers:
            await consumer.start()
        await self.row_writer.start()
        specs = [stage.spec for stage in self.stages]
        if metrics is not None:
            metrics.poll(nc.jetstream(), specs, self.common.metrics_interval)
        self.service_api = StageService(nc, worker=self.service, signals=self.signals,
                                        specs=specs, metadata=metadata)
        await self.service_api.start()
        self.signals.consuming = True
        # Models, clients and imports are built: keep them out of every collection,
        # and collect young objects less often (each message allocates many).
        gc.freeze()
        gc.set_threshold(20_000, 50, 100)
        log.info("%s", start_line(self.service, specs))

    def _start_metrics(self) -> Metrics | None:
        """The worker's metrics when an exporter is chosen (shared.common.otel)."""
        common = self.common
        names = common.otel.metrics_exporters(common.metrics_port)
        if not names:
            return None
        prometheus = None
        if "prometheus" in names:
            prometheus = (common.metrics_host, common.metrics_port or PROMETHEUS_PORT)
        return Metrics(self.signals, resource=worker_resource(self.service, common.otel),
                       readers=[make() for make in self._metric_readers],
                       prometheus=prometheus)

    async def stop(self) -> None:
        """Leave the services API, stop pulling; in-flight handlers finish while the
        connection is still up."""
        log.info("worker %s stopping", self.service)
        self.signals.consuming = False
        if self.service_api is not None:
            try:  # bounded: with the server away, draining its subscriptions would wait
                await asyncio.wait_for(self.service_api.stop(), 2.0)
            except Exception as exc:  # the connection already gone: nothing to leave
                log.warning("services API: %r", exc)
        for consumer in self.consumers:
            await consumer.stop()
        if self.row_writer is not None:
            await self.row_writer.stop()

    async def close(self) -> None:
        if self.metrics is not None:
            await self.metrics.close()
            self.metrics = None
        if self.deps is not None:
            await self.deps.close()
            self.deps = None
        if self._owns_provider and isinstance(self._provider, SdkTracerProvider):
            # Exports the spans still batched (bounded by the exporter's timeout).
            await asyncio.to_thread(self._provider.shutdown)


def build_app(
    *,
    service: str,
    common: CommonSettings,
    stages: Sequence[Consumes[D]],
    make_deps: MakeDeps[D],
    tracer_provider: TracerProvider | None = None,
    consumers: Mapping[str, MakeConsumer[D]] | None = None,
) -> FastStream:
    """The worker's FastStream application; `make_deps` turns what the runtime built
    (bus, store, tracer, exit stack, connection) into what its stages need; `consumers`
    (by durable) replaces a stage's plain consumer."""
    configure_logging(level=common.log_level, fmt=common.log_format, worker=service)
    # The exporters are resolved here: a name no installed package provides is one
    # line from the CLI (SettingError) before anything connects.
    provider = tracer_provider or build_tracer_provider(service, common.otel)
    readers = metric_reader_factories(
        common.otel, common.otel.metrics_exporters(common.metrics_port))
    broker = make_broker(common)
    worker = Worker(broker, service=service, common=common, stages=stages,
                    make_deps=make_deps, tracer_provider=provider, consumers=consumers,
                    metric_readers=readers, owns_provider=tracer_provider is None)
    return FastStream(
        broker,
        # Its own "app started" lines name no worker: `Worker.start` logs one that does.
        logger=None,
        after_startup=[worker.start],
        on_shutdown=[worker.stop],
        after_shutdown=[worker.close],
    )



@dataclass(frozen=True)
class ClientWiring:
    """What the runtime built for a worker that reads no stage: its connection, its
    tracer, the signals it exports (its endpoints' counts, its readiness), and the exit
    stack that closes what it opens, after it stops."""

    nc: Client
    tracer: Tracer
    signals: WorkerSignals
    exits: AsyncExitStack


Serve = Callable[[ClientWiring], Awaitable[None]]


class ClientWorker:
    """One process of a worker type that reads no stage (module doc)."""

    def __init__(self, broker: NatsBroker, *, service: str, common: CommonSettings,
                 serve: Serve, endpoints: Sequence[Endpoint],
                 tracer_provider: TracerProvider | None,
                 metric_readers: Sequence[Callable[[], MetricReader]] = (),
                 owns_provider: bool = False) -> None:
        self.broker = broker
        self.service = service
        self.common = common
        self._serve = serve
        self._endpoints = endpoints
        self._provider = tracer_provider
        self._owns_provider = owns_provider
        self._metric_readers = metric_readers
        self.signals = WorkerSignals(service_name(service))
        self.exits = AsyncExitStack()
        self.metrics: Metrics | None = None
        self.service_api: StageService | None = None

    async def start(self) -> None:
        nc = await self.broker.connect()
        tracer = tracer_for(f"intentroute.{self.service}", self._provider)
        try:
            await self._serve(ClientWiring(nc=nc, tracer=tracer, signals=self.signals,
                                           exits=self.exits))
        except BaseException:
            await self.exits.aclose()
            raise
        metadata: dict[str, str] = {}
        names = self.common.otel.metrics_exporters(self.common.metrics_port)
        if names:
            prometheus = None
            if "prometheus" in names:
                prometheus = (self.common.metrics_host,
                              self.common.metrics_port or PROMETHEUS_PORT)
            self.metrics = Metrics(self.signals,
                                   resource=worker_resource(self.service, self.common.otel),
                                   readers=[make() for make in self._metric_readers],
                                   prometheus=prometheus)
            if self.metrics.serve():
                metadata["metrics"] = self.metrics.address
        self.service_api = StageService(nc, worker=self.service, signals=self.signals,
                                        specs=(), endpoints=self._endpoints,
                                        metadata=metadata)
        await self.service_api.start()
        self.signals.consuming = True
        # As a stage worker: what is built stays out of every collection, and young
        # objects are collected less often (each call allocates many).
        gc.freeze()
        gc.set_threshold(20_000, 50, 100)
        log.info("worker %s started: %s", self.service,
                 ", ".join(e.name for e in self._endpoints) or "no endpoint")

    async def stop(self) -> None:
        """Not ready from now on (probes), off the services API."""
        log.info("worker %s stopping", self.service)
        self.signals.consuming = False
        if self.service_api is not None:
            try:  # bounded, as a stage worker's
                await asyncio.wait_for(self.service_api.stop(), 2.0)
            except Exception as exc:
                log.warning("services API: %r", exc)

    async def close(self) -> None:
        await self.exits.aclose()
        if self.metrics is not None:
            await self.metrics.close()
            self.metrics = None
        if self._owns_provider and isinstance(self._provider, SdkTracerProvider):
            await asyncio.to_thread(self._provider.shutdown)


def build_client_app(*, service: str, common: CommonSettings, serve: Serve,
                     endpoints: Sequence[Endpoint] = (),
                     tracer_provider: TracerProvider | None = None) -> FastStream:
    """The FastStream application of a worker that reads no stage: `serve` builds and
    starts what it serves once connected (pushing what closes it on `exits`);
    `endpoints`: what it reports on the services API (its signals' stages of those
    names)."""
    configure_logging(level=common.log_level, fmt=common.log_format, worker=service)
    provider = tracer_provider or build_tracer_provider(service, common.otel)
    readers = metric_reader_factories(
        common.otel, common.otel.metrics_exporters(common.metrics_port))
    worker = ClientWorker(make_broker(common), service=service, common=common, serve=serve,
                          endpoints=endpoints, tracer_provider=provider,
                          metric_readers=readers, owns_provider=tracer_provider is None)
    return FastStream(worker.broker, logger=None,
                      after_startup=[worker.start], on_shutdown=[worker.stop],
                      after_shutdown=[worker.close])
