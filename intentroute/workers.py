"""Worker registry: name -> app factory. The CLI and tests start workers by name.

`STAGES` read the pipeline's streams; `doors` is the pipeline's client for callers that
do not speak NATS; `WORKERS` (both) is what `intentroute up` and the tests start by
default. `learner` (the learning job every LEARN_INTERVAL seconds) is started on demand:
`up` runs it when LEARN_INTERVAL is set, or with `--replicas learner=N`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

from faststream import FastStream
from opentelemetry.trace import TracerProvider

from shared.contracts.routing import ModelSlot

STAGES: tuple[str, ...] = (
    "gateway",
    "classifier",
    "retriever",
    "generator-main",
    "generator-conversational",
    "validator",
)
DOORS = "doors"
LEARNER = "learner"
WORKERS: tuple[str, ...] = (*STAGES, DOORS)
# Every worker type `intentroute worker NAME` runs.
ALL_WORKERS: tuple[str, ...] = (*WORKERS, LEARNER)


def create_worker(
    name: str,
    environ: Mapping[str, str] | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
) -> FastStream:
    """Build the named worker's app from the environment (or `environ`)."""
    factories: dict[str, Callable[[], FastStream]] = {
        "gateway": lambda: _gateway(environ, tracer_provider),
        "classifier": lambda: _classifier(environ, tracer_provider),
        "retriever": lambda: _retriever(environ, tracer_provider),
        "generator-main": lambda: _generator(environ, ModelSlot.MAIN, tracer_provider),
        "generator-conversational": lambda: _generator(
            environ, ModelSlot.CONVERSATIONAL, tracer_provider
        ),
        "validator": lambda: _validator(environ, tracer_provider),
        DOORS: lambda: _doors(environ, tracer_provider),
        LEARNER: lambda: _learner(environ, tracer_provider),
    }
    if name not in factories:
        raise KeyError(f"unknown worker {name!r}; known: {', '.join(ALL_WORKERS)}")
    return factories[name]()


def _gateway(environ: Mapping[str, str] | None, tp: TracerProvider | None) -> FastStream:
    from services.gateway.app import create_app
    from services.gateway.settings import GatewaySettings

    return create_app(GatewaySettings.from_env(environ), tracer_provider=tp)


def _classifier(environ: Mapping[str, str] | None, tp: TracerProvider | None) -> FastStream:
    from services.classifier.app import create_app
    from services.classifier.settings import ClassifierSettings

    return create_app(ClassifierSettings.from_env(environ), tracer_provider=tp)


def _retriever(environ: Mapping[str, str] | None, tp: TracerProvider | None) -> FastStream:
    from services.retriever.app import create_app
    from services.retriever.settings import RetrieverSettings

    return create_app(RetrieverSettings.from_env(environ), tracer_provider=tp)


def _generator(
    environ: Mapping[str, str] | None, slot: ModelSlot, tp: TracerProvider | None
) -> FastStream:
    from services.generator.app import create_app
    from services.generator.settings import GeneratorSettings

    return create_app(GeneratorSettings.from_env(environ, slot=slot), tracer_provider=tp)


def _validator(environ: Mapping[str, str] | None, tp: TracerProvider | None) -> FastStream:
    from services.validator.app import create_app
    from services.validator.settings import ValidatorSettings

    return create_app(ValidatorSettings.from_env(environ), tracer_provider=tp)


def _doors(environ: Mapping[str, str] | None, tp: TracerProvider | None) -> FastStream:
    from services.doors.app import create_app
    from services.doors.settings import DoorsSettings

    return create_app(DoorsSettings.from_env(environ), tracer_provider=tp)


def _learner(environ: Mapping[str, str] | None, tp: TracerProvider | None) -> FastStream:
    from services.learner.app import create_app
    from services.learner.settings import LearnerSettings

    return create_app(LearnerSettings.from_env(environ), tracer_provider=tp)


async def wait_for_consumers(nc: object, durables: list[str], timeout: float = 180.0) -> None:
    """Block until every worker's durable consumer exists (workers load models first);
    the gateway, whose consumers are per agent and made on demand, and a worker that
    reads no stage (the doors), until it answers the services API (it registers once
    it serves)."""
    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeoutError
    from nats.js.errors import NotFoundError

    from shared.auth.permissions import SERVICES_API, WORKER_GRANTS, service_user

    js = nc.jetstream()  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    for durable in durables:
        grant = WORKER_GRANTS.get(durable)
        while True:
            try:
                if grant is None or grant.per_agent:
                    await nc.request(  # type: ignore[attr-defined]
                        f"{SERVICES_API}.PING.{service_user(durable)}", b"", timeout=0.5)
                else:
                    await js.consumer_info(grant.stream, durable)
                break
            except (NotFoundError, NoRespondersError, NatsTimeoutError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"worker {durable} did not start") from None
                await asyncio.sleep(0.25)
