"""The retriever's composition root in small steps (as cosmicpython's bootstrap): the
index (Elasticsearch, or the embedded one with its query encoder) and the LLM relevance
judge, built from the settings. `app.py` calls them."""

from __future__ import annotations

from typing import Any

from services.retriever.embedded import EmbeddedRetrieval
from services.retriever.ports import RelevanceJudge, Retrieval
from services.retriever.settings import RetrieverSettings


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
    return EmbeddedRetrieval(settings.index_dir, method=settings.method, encoder=encoder,
                             settings=settings.fusion)


def build_judge(settings: RetrieverSettings, nc: Any = None) -> RelevanceJudge | None:
    """The LLM relevance judge (RELEVANCE_CHECK=llm) on its chain of fleet models
    (shared.llm.select.label_chain), the shared circuits on `nc` when given; None
    without a model server or a model."""
    if settings.relevance_mode != "llm":
        return None
    from services.retriever.adapters import ModelRelevanceJudge
    from shared.llm.select import label_chain, open_walker

    walker, _ = open_walker(settings.common, nc, timeout=settings.relevance_timeout)
    refs = label_chain(walker.fleet, settings.common, "relevance", settings.relevance_model)
    if not refs:
        return None
    return ModelRelevanceJudge(walker, refs, timeout=settings.relevance_timeout)
