"""Classifier worker: settings -> stage -> deps (encoder + head, LLM)."""

from __future__ import annotations

from faststream import FastStream
from opentelemetry.trace import TracerProvider

from services.classifier.cascade import Cascade, CascadeConfig
from services.classifier.handlers import ClassifierDeps, build_stage
from services.classifier.settings import ClassifierSettings
from shared.runtime.worker import Wiring, build_app
from shared.store import asyncpg_dsn
from shared.store.policy_cache import open_policy_cache


def create_app(
    settings: ClassifierSettings | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
) -> FastStream:
    settings = settings or ClassifierSettings.from_env()

    async def make_deps(wiring: Wiring) -> ClassifierDeps:
        from services.classifier.adapters import build_layer2, build_llm
        from services.classifier.answer_cache import ClassifierCache
        from services.classifier.cache_vectors import RememberingLayer2

        built = build_layer2(settings)
        # Layer 2 keeps each message's vector for the answer cache (computed once).
        layer2 = RememberingLayer2(built) if built is not None else None
        if layer2 is not None:
            wiring.base.exits.push_async_callback(layer2.close)
        cascade = Cascade(
            CascadeConfig(threshold=settings.threshold),
            layer2=layer2,
            llm=build_llm(settings),
        )
        policies = await open_policy_cache(wiring.store.pool,
                                           refresh=settings.common.policy_refresh,
                                           exits=wiring.base.exits)
        answer_cache = None
        if layer2 is not None:  # the cache matches on Layer 2's vectors
            answer_cache = await ClassifierCache(
                wiring.store.pool, asyncpg_dsn(settings.common.database_url), settings.common,
                policies, layer2).start()
            wiring.base.exits.push_async_callback(answer_cache.close)
        return ClassifierDeps(**wiring.base.parts(), cascade=cascade, policies=policies,
                              answer_cache=answer_cache)

    return build_app(service="classifier", common=settings.common,
                     stages=[build_stage(settings)], make_deps=make_deps,
                     tracer_provider=tracer_provider)
