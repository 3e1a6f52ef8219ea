"""Classifier worker: settings -> stage -> deps (encoder + head, LLM, the answer cache:
bootstrap.py)."""

from __future__ import annotations

from faststream import FastStream
from opentelemetry.trace import TracerProvider

from services.classifier.cascade import Cascade, CascadeConfig
from services.classifier.handlers import ClassifierDeps, build_stage
from services.classifier.settings import ClassifierSettings
from shared.runtime.worker import Wiring, build_app
from shared.store.policy_cache import open_policy_cache


def create_app(
    settings: ClassifierSettings | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
) -> FastStream:
    settings = settings or ClassifierSettings.from_env()

    async def make_deps(wiring: Wiring) -> ClassifierDeps:
        from services.classifier.adapters import build_llm
        from services.classifier.bootstrap import build_remembering_layer2, open_answer_cache

        exits = wiring.base.exits
        layer2 = build_remembering_layer2(settings, exits)
        cascade = Cascade(
            CascadeConfig(threshold=settings.threshold),
            layer2=layer2,
            llm=build_llm(settings, wiring.nc),
        )
        policies = await open_policy_cache(wiring.store.pool,
                                           refresh=settings.common.policy_refresh,
                                           exits=exits)
        answer_cache = await open_answer_cache(settings, wiring.store.pool, policies, layer2,
                                               exits)
        return ClassifierDeps(**wiring.base.parts(), cascade=cascade, policies=policies,
                              answer_cache=answer_cache)

    return build_app(service="classifier", common=settings.common,
                     stages=[build_stage(settings)], make_deps=make_deps,
                     tracer_provider=tracer_provider)
