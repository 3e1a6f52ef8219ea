"""Generator worker for one model slot: settings -> stage -> deps (model backend:
bootstrap.py)."""

from __future__ import annotations

import asyncio

from faststream import FastStream
from opentelemetry.trace import TracerProvider

from services.generator.backends import EchoBackend, OpenAIBackend
from services.generator.bootstrap import choose_backend, report_probe
from services.generator.handlers import GeneratorDeps, build_stage
from services.generator.health import BackendHealth
from services.generator.settings import GeneratorSettings
from shared.runtime.worker import Wiring, build_app
from shared.store.policy_cache import open_policy_cache


def create_app(
    settings: GeneratorSettings | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
) -> FastStream:
    settings = settings or GeneratorSettings.from_env()

    async def make_deps(wiring: Wiring) -> GeneratorDeps:
        backend = choose_backend(settings)
        model = settings.model or ("echo" if isinstance(backend, EchoBackend) else "")
        health = BackendHealth(backend.name if backend else "", model)
        wiring.signals.watch_state("backend", health.state)
        if isinstance(backend, OpenAIBackend):
            wiring.base.exits.push_async_callback(backend.aclose)
            probe = asyncio.create_task(report_probe(backend, health=health))
            wiring.base.exits.callback(probe.cancel)
        policies = await open_policy_cache(wiring.store.pool,
                                           refresh=settings.common.policy_refresh,
                                           exits=wiring.base.exits)
        return GeneratorDeps(**wiring.base.parts(), backend=backend, model=model,
                             policies=policies, health=health)

    return build_app(service=f"generator-{settings.slot.value}", common=settings.common,
                     stages=[build_stage(settings)], make_deps=make_deps,
                     tracer_provider=tracer_provider)
