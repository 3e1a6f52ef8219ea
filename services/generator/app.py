"""Generator worker for one model slot: settings -> stage -> lifespan."""

from __future__ import annotations

from faststream import FastStream
from opentelemetry.trace import TracerProvider

from services.generator.backends import ChatBackend, EchoBackend, OllamaBackend
from services.generator.handlers import GeneratorDeps, build_stage
from services.generator.settings import GeneratorSettings
from shared.bus import Bus
from shared.runtime import build_app
from shared.store.stores import Store
from shared.telemetry import build_tracer_provider, tracer_for


def choose_backend(settings: GeneratorSettings) -> ChatBackend | None:
    """None means the extractive answerer answers on its own."""
    if settings.backend == "echo":
        return EchoBackend()
    if settings.backend == "extractive" or not settings.ollama_host:
        return None
    return OllamaBackend(settings.ollama_host, timeout=settings.ollama_timeout)


def create_app(
    settings: GeneratorSettings | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
) -> FastStream:
    settings = settings or GeneratorSettings.from_env()
    provider = tracer_provider or build_tracer_provider(
        f"intentroute-generator-{settings.slot.value}", settings.common.otlp_endpoint
    )
    tracer = tracer_for("intentroute.generator", provider)

    async def make_deps(bus: Bus) -> GeneratorDeps:
        store = await Store.connect(settings.common.database_url, tracer=tracer)
        backend = choose_backend(settings)
        model = settings.model or ("echo" if isinstance(backend, EchoBackend) else "")
        return GeneratorDeps(bus, store, backend, model, tracer)

    return build_app(
        common=settings.common,
        stages=[build_stage(settings)],
        make_deps=make_deps,
        tracer_provider=provider,
    )
