"""Generator worker for one model slot: settings -> stage -> deps (model backend)."""

from __future__ import annotations

import asyncio
import logging

from faststream import FastStream
from opentelemetry.trace import TracerProvider

from services.generator.backends import EchoBackend, OpenAIBackend, ProbeFailure
from services.generator.handlers import GeneratorDeps, build_stage
from services.generator.health import BackendHealth
from services.generator.ports import ChatBackend
from services.generator.settings import GeneratorSettings
from shared.cache.offer import CacheWriter
from shared.contracts.routing import ModelSlot
from shared.llm.select import open_backend
from shared.runtime.worker import Wiring, build_app
from shared.store.policy_cache import open_policy_cache

log = logging.getLogger("intentroute.generator")


def choose_backend(settings: GeneratorSettings) -> ChatBackend | None:
    """None means the extractive answerer answers on its own."""
    kind = settings.backend_kind
    if kind == "echo":
        return EchoBackend(settings.echo_delay)
    if kind in ("ollama", "openai"):
        return open_backend(settings.common, kind, timeout=settings.ollama_timeout)
    return None


async def report_probe(backend: OpenAIBackend, *, tries: int = 30, pause: float = 1.0,
                       health: BackendHealth | None = None) -> ProbeFailure | None:
    """A wrong URL or key fails every call, each answer falling back to the extractive
    answerer: say why once, at start, in one warning line (not fatal), and in `health`
    (`intentroute status`). A server not listening yet (`up --llm` starts it beside the
    workers) is asked again meanwhile."""
    problem = await backend.probe()
    for _ in range(tries - 1):
        if problem is None or problem.status is not None:
            break
        await asyncio.sleep(pause)
        problem = await backend.probe()
    if health is not None:
        health.probe(problem.reason if problem else None)
    if problem:
        log.warning("openai backend: %s; answers fall back to the extractive answerer "
                    "(check OPENAI_BASE_URL, /v1 included, and OPENAI_API_KEY)",
                    problem.reason)
    return problem


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
        answer_cache = None
        if settings.slot is ModelSlot.MAIN:  # the cached types' slot (RC-05)
            answer_cache = CacheWriter(wiring.store.pool, settings.common, policies=policies)
            wiring.base.exits.push_async_callback(answer_cache.close)
        return GeneratorDeps(**wiring.base.parts(), backend=backend, model=model,
                             policies=policies, health=health, answer_cache=answer_cache)

    return build_app(service=f"generator-{settings.slot.value}", common=settings.common,
                     stages=[build_stage(settings)], make_deps=make_deps,
                     tracer_provider=tracer_provider)
