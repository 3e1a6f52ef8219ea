"""Classifier worker: settings -> stage -> lifespan (store, encoder + head, LLM)."""

from __future__ import annotations

from faststream import FastStream
from opentelemetry.trace import TracerProvider

from services.classifier.cascade import Cascade, CascadeConfig
from services.classifier.handlers import ClassifierDeps, build_stage
from services.classifier.settings import ClassifierSettings
from shared.bus import Bus
from shared.runtime import build_app
from shared.store.stores import Store
from shared.telemetry import build_tracer_provider, tracer_for


def create_app(
    settings: ClassifierSettings | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
) -> FastStream:
    settings = settings or ClassifierSettings.from_env()
    provider = tracer_provider or build_tracer_provider(
        "intentroute-classifier", settings.common.otlp_endpoint
    )

    async def make_deps(bus: Bus) -> ClassifierDeps:
        from services.classifier.adapters import build_layer2, build_llm

        store = await Store.connect(
            settings.common.database_url, tracer=tracer_for("intentroute.classifier", provider)
        )
        layer2 = build_layer2(settings)
        cascade = Cascade(
            CascadeConfig(trusted_agents=settings.trusted_agents, threshold=settings.threshold),
            layer2=layer2,
            llm=build_llm(settings),
        )
        return ClassifierDeps(bus, store, cascade, layer2)

    return build_app(
        common=settings.common,
        stages=[build_stage(settings)],
        make_deps=make_deps,
        tracer_provider=provider,
    )
