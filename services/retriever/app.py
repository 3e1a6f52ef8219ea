"""Retriever worker: settings -> stage -> deps (index, encoder, relevance judge:
bootstrap.py)."""

from __future__ import annotations

from faststream import FastStream
from opentelemetry.trace import TracerProvider

from services.retriever.bootstrap import build_judge, build_retrieval
from services.retriever.handlers import RetrieverDeps, build_stage
from services.retriever.ports import Retrieval
from services.retriever.settings import RetrieverSettings
from shared.runtime.worker import Wiring, build_app


def create_app(
    settings: RetrieverSettings | None = None,
    *,
    retrieval: Retrieval | None = None,
    tracer_provider: TracerProvider | None = None,
) -> FastStream:
    settings = settings or RetrieverSettings.from_env()

    async def make_deps(wiring: Wiring) -> RetrieverDeps:
        backend = retrieval or build_retrieval(settings)
        wiring.base.exits.push_async_callback(backend.close)
        return RetrieverDeps(**wiring.base.parts(), retrieval=backend,
                             judge=build_judge(settings, wiring.nc))

    return build_app(service="retriever", common=settings.common,
                     stages=[build_stage(settings)], make_deps=make_deps,
                     tracer_provider=tracer_provider)
