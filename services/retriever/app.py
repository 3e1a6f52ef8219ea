"""Retriever worker: settings -> stage -> deps (index, encoder, relevance judge)."""

from __future__ import annotations

from faststream import FastStream
from opentelemetry.trace import TracerProvider

from services.retriever.embedded import EmbeddedRetrieval
from services.retriever.handlers import RetrieverDeps, build_stage
from services.retriever.ports import Retrieval
from services.retriever.settings import RetrieverSettings
from shared.runtime.worker import Wiring, build_app


def build_retrieval(settings: RetrieverSettings) -> Retrieval:
    if settings.es_url:
        from services.retriever.es_backend import ElasticsearchRetrieval

        return ElasticsearchRetrieval.from_settings(settings)
    encoder = None
    if settings.method != "bm25":
        from shared.encoders.embeddings import pin_threads
        from shared.encoders.fast import shared_fast_encoder

        # Query embedding is most of a hybrid query's cost: one thread, the fast path.
        pin_threads(1)
        encoder = shared_fast_encoder(settings.embedding_model,
                                      precision=settings.common.encoder_precision,
                                      onnx_cache_dir=settings.common.onnx_cache_dir)
    return EmbeddedRetrieval(settings.index_dir, method=settings.method, encoder=encoder)


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
        judge = None
        if settings.relevance_mode == "llm" and settings.ollama_host and settings.relevance_model:
            from services.retriever.adapters import OllamaRelevanceJudge

            judge = OllamaRelevanceJudge(settings.ollama_host, settings.relevance_model)
        return RetrieverDeps(**wiring.base.parts(), retrieval=backend, judge=judge)

    return build_app(service="retriever", common=settings.common,
                     stages=[build_stage(settings)], make_deps=make_deps,
                     tracer_provider=tracer_provider)
