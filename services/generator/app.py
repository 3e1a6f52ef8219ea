"""Generator worker for one model slot: settings -> stage -> deps (model backend)."""

from __future__ import annotations

from faststream import FastStream
from opentelemetry.trace import TracerProvider

from services.generator.backends import ChatBackend, EchoBackend, OllamaBackend
from services.generator.handlers import GeneratorDeps, build_stage
from services.generator.settings import GeneratorSettings
from shared.policy_cache import open_policy_cache
from shared.runtime import Wiring, build_app


def choose_backend(settings: GeneratorSettings) -> ChatBackend | None:
    """None means the extractive answerer answers on its own."""
    if settings.backend == "echo":
        return EchoBackend(settings.echo_delay)
    if settings.backend == "extractive" or not settings.ollama_host:
        return None
    return OllamaBackend(settings.ollama_host, timeout=settings.ollama_timeout)


def create_app(
    settings: GeneratorSettings | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
) -> FastStream:
    settings = settings or GeneratorSettings.from_env()

    async def make_deps(wiring: Wiring) -> GeneratorDeps:
        backend = choose_backend(settings)
        model = settings.model or ("echo" if isinstance(backend, EchoBackend) else "")
        policies = await open_policy_cache(wiring.store.pool,
                                           refresh=settings.common.policy_refresh,
                                           exits=wiring.base.exits)
        return GeneratorDeps(**wiring.base.parts(), backend=backend, model=model,
                             policies=policies)

    return build_app(service=f"generator-{settings.slot.value}", common=settings.common,
                     stages=[build_stage(settings)], make_deps=make_deps,
                     tracer_provider=tracer_provider)
