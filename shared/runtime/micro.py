"""Every worker on the NATS services API (`$SRV.PING / INFO / STATS`), via nats.micro.

A worker reads JetStream, not request-reply subjects, so its "endpoints" are its stage
consumers: INFO lists each one (name = the durable, subject = the stage's subject,
queue group = the durable its replicas share) and STATS reports what the stage
consumer counted (`shared.runtime.signals`): `num_requests` (deliveries handled),
`num_errors` (error answers, retries, dead letters, handler failures),
`processing_time` / `average_processing_time` (ns), and in `data` the outcomes,
redeliveries, messages in flight and the latency buckets `intentroute status` merges
across replicas for its p95, the circuit breakers' states (`breakers`) and the
worker's named one-line states (`states`: the generator's model backend). So `nats
micro ls / info / stats intentroute-classifier` and `intentroute status` see the same
replicas.

The service name is the worker's NATS user (`intentroute-<worker>`): its permissions
allow subscribing to the control subjects of that name only (shared.auth.permissions).
"""

from __future__ import annotations

import importlib.metadata
import os
import socket
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import NamedTuple

from nats.aio.client import Client
from nats.micro.service import (
    EndpointInfo,
    EndpointStats,
    Service,
    ServiceConfig,
    ServiceInfo,
    ServiceStats,
)

from shared.auth.permissions import service_user
from shared.runtime.consumer import StageSpec
from shared.runtime.signals import WorkerSignals


def service_name(worker: str) -> str:
    """The services-API name of a worker type: its NATS user's name."""
    return service_user(worker)


def _version() -> str:
    try:
        return importlib.metadata.version("intentroute")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0"


class Endpoint(NamedTuple):
    """One endpoint of a worker on the services API: a stage (its durable, subject and
    delivery settings), or what a worker that reads no stage counts (the doors' calls)."""

    name: str
    subject: str
    metadata: Mapping[str, str] = {}

    @classmethod
    def of(cls, spec: StageSpec) -> Endpoint:
        return cls(spec.durable, spec.subject, {"stream": spec.stream,
                                                "max_inflight": str(spec.max_inflight)})


class StageService(Service):
    """A worker's services-API face: its stage consumers (or its own counts) as
    endpoints, each reporting the `signals` kept under its name."""

    def __init__(self, nc: Client, *, worker: str, signals: WorkerSignals,
                 specs: Sequence[StageSpec], metadata: Mapping[str, str],
                 endpoints: Sequence[Endpoint] = ()) -> None:
        meta = {"worker": worker, "pid": str(os.getpid()), "host": socket.gethostname(),
                **metadata}
        self._counted = [*(Endpoint.of(spec) for spec in specs), *endpoints]
        super().__init__(nc, ServiceConfig(
            name=service_name(worker), version=_version(), metadata=meta,
            description=f"intentroute {worker} worker: {'stages ' if specs else ''}"
                        + ", ".join(e.name for e in self._counted)))
        self._worker = worker
        self._signals = signals
        self._meta = meta
        self._name_ = service_name(worker)
        self._started_at = datetime.now(UTC)

    def info(self) -> ServiceInfo:
        return ServiceInfo(
            name=self._name_, id=self.id, version=_version(),
            description=f"intentroute {self._worker} worker", metadata=dict(self._meta),
            endpoints=[EndpointInfo(name=e.name, subject=e.subject, queue_group=e.name,
                                    metadata=dict(e.metadata))
                       for e in self._counted])

    def stats(self) -> ServiceStats:
        breakers = self._signals.breaker_states()
        states = self._signals.state_lines()
        endpoints = []
        for e in self._counted:
            stats = self._signals.stage(e.name)
            data = stats.snapshot()
            if breakers:
                data["breakers"] = breakers
            if states:
                data["states"] = states
            endpoints.append(EndpointStats(
                name=e.name, subject=e.subject, queue_group=e.name,
                num_requests=stats.handled, num_errors=stats.errors,
                processing_time=stats.processing_ns,
                average_processing_time=stats.processing_ns // max(1, stats.handled),
                last_error=stats.last_error or None, data=data))
        return ServiceStats(id=self.id, name=self._name_, version=_version(),
                            started=self._started_at, endpoints=endpoints,
                            metadata=dict(self._meta))
