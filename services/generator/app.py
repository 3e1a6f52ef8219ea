"""Generator worker for one model slot: settings -> stage -> deps (the fleet's walker,
the answer cache's writer: bootstrap.py)."""

from __future__ import annotations

from functools import partial

from faststream import FastStream
from opentelemetry.trace import TracerProvider

from services.generator.backends import open_walker, refresh_circuits, report_probes
from services.generator.bootstrap import open_answer_cache
from services.generator.handlers import GeneratorDeps, build_stage
from services.generator.health import FleetHealth
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
        exits = wiring.base.exits
        walker, model, closing = open_walker(settings, wiring.nc)
        exits.push_async_callback(closing)
        health = FleetHealth([model, *(r for r in walker.fleet.refs() if r != model)]
                             if model else [])
        wiring.signals.watch_state("backend", health.state)
        for backend in walker.fleet.backends:
            wiring.signals.watch_breaker(f"llm:{backend}", partial(health.breaker, backend))
        exits.push_async_callback(refresh_circuits(walker, health).stop)
        exits.push_async_callback(report_probes(walker, health).stop)
        policies = await open_policy_cache(wiring.store.pool,
                                           refresh=settings.common.policy_refresh,
                                           exits=exits)
        answer_cache = open_answer_cache(settings, wiring.store.pool, policies, exits)
        return GeneratorDeps(**wiring.base.parts(), walker=walker, model=model,
                             policies=policies, health=health, answer_cache=answer_cache)

    return build_app(service=f"generator-{settings.slot.value}", common=settings.common,
                     stages=[build_stage(settings)], make_deps=make_deps,
                     tracer_provider=tracer_provider)
