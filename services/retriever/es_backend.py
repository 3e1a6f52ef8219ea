"""Elasticsearch as the retrieval port: one method per instance, mapped to queries.

bm25 is a `match` query, dense a `knn` query; hybrid runs both concurrently and fuses
them client-side with the same `fusion.fuse()` as the embedded index, which works on the
free Basic license (the server-side `retriever.rrf` API needs an Enterprise license on
8.x). A hit one method did not return gets that method's lowest returned score (the
embedded index knows every chunk's score: SciFact train nDCG@10 0.737, 0.736 this way).

An ES ingest (`indexing.es_ingest`) is applied in place (bulk upserts and deletes,
then one refresh), so a concurrent search may see a partly updated index for the
duration of the bulk; `maybe_reload` has nothing to do.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
import numpy.typing as npt

from services.retriever.es_bodies import (
    DEFAULT_INDEX,
    VECTOR_FIELD,
    build_bm25_query,
    build_knn_query,
    call,
    knn_score_to_cosine,
)
from services.retriever.fusion import FusionSettings, fuse
from services.retriever.ports import SearchResult, check_method
from services.retriever.rrf import rrf
from services.retriever.settings import RetrieverSettings
from shared.common.deadline import time_left
from shared.contracts.pipeline import Passage
from shared.encoders.embeddings import Encoder

# HNSW candidates per shard = k x this factor.
NUM_CANDIDATES_FACTOR = 2.0


class ElasticsearchRetrieval:
    """Search over an index filled by `indexing.es_ingest` (official async client)."""

    def __init__(
        self,
        client: Any,
        encoder: Encoder | None,
        *,
        method: str = "hybrid",
        index: str = DEFAULT_INDEX,
        settings: FusionSettings | None = None,
    ) -> None:
        self.client = client
        self.encoder = encoder
        self.method = check_method(method)
        self.index = index
        self.settings = settings or FusionSettings()

    @classmethod
    def from_url(cls, url: str, encoder: Encoder | None, **kwargs: Any) -> ElasticsearchRetrieval:
        from elasticsearch import AsyncElasticsearch

        return cls(AsyncElasticsearch(url), encoder, **kwargs)

    @classmethod
    def from_settings(cls, settings: RetrieverSettings) -> ElasticsearchRetrieval:
        encoder: Encoder | None = None
        if settings.method != "bm25":
            from shared.encoders.embeddings import SentenceTransformerEncoder, pin_threads

            pin_threads(1)
            encoder = SentenceTransformerEncoder(settings.embedding_model)
        return cls.from_url(settings.es_url, encoder, method=settings.method,
                            index=settings.es_index, settings=settings.fusion)

    async def close(self) -> None:
        await self.client.close()

    async def maybe_reload(self) -> bool:
        return False  # the cluster always serves the latest refresh

    async def _search(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        # Bounded by what is left of the request's deadline (and ES's own 30 s).
        client = self.client.options(request_timeout=time_left(30.0))
        resp = await call(client.search(index=self.index, body=body))
        return list(resp["hits"]["hits"])

    def _num_candidates(self, k: int) -> int:
        return max(k, math.ceil(k * NUM_CANDIDATES_FACTOR))

    async def search(self, query: str, k: int) -> SearchResult:
        method = self.method
        if method == "bm25":
            hits = await self._search(build_bm25_query(query, k))
            return self._result(hits, [h["_score"] for h in hits], None,
                                bm25={h["_id"]: h["_score"] for h in hits})
        if self.encoder is None:
            raise RuntimeError("dense/hybrid search needs an encoder")
        enc = self.encoder
        qv = np.asarray((await asyncio.to_thread(enc.encode, [query], 1))[0], dtype=np.float32)
        if method == "dense":
            hits = await self._search(build_knn_query(qv, k, self._num_candidates(k)))
            cos = [knn_score_to_cosine(h["_score"]) for h in hits]
            return self._result(hits, cos, qv, dense_top1=cos[0] if cos else None)

        depth = max(self.settings.depth, k)
        b_hits, d_hits = await asyncio.gather(
            self._search(build_bm25_query(query, depth, with_source=False)),
            self._search(build_knn_query(qv, depth, self._num_candidates(depth),
                                         with_source=False)),
        )
        hits = [{h["_id"]: float(h["_score"]) for h in b_hits},
                {h["_id"]: knn_score_to_cosine(h["_score"]) for h in d_hits}]
        fused = fuse(hits, self.settings)[:k]
        ids = [i for i, _ in fused]
        docs: list[dict[str, Any]] = []
        if ids:
            resp = await call(self.client.mget(index=self.index, ids=ids))
            docs = [d for d in resp["docs"] if d.get("found")]
        score_of = dict(fused)
        dense_top1 = knn_score_to_cosine(d_hits[0]["_score"]) if d_hits else None
        result = self._result(docs, [score_of[d["_id"]] for d in docs], qv,
                              bm25={h["_id"]: h["_score"] for h in b_hits},
                              dense_top1=dense_top1)
        if docs:
            result.rrf_top1 = dict(rrf([list(h) for h in hits]))[docs[0]["_id"]]
        return result

    def _result(
        self,
        hits: list[dict[str, Any]],
        scores: list[float],
        qv: npt.NDArray[np.float32] | None,
        *,
        bm25: dict[str, float] | None = None,
        dense_top1: float | None = None,
    ) -> SearchResult:
        passages = []
        vecs = []
        for h, s in zip(hits, scores, strict=True):
            src = h.get("_source") or {}
            passages.append(Passage(doc_id=src.get("doc_id", ""), title=src.get("title", ""),
                                    text=src.get("text", ""), score=float(s),
                                    source=src.get("source", "")))
            if VECTOR_FIELD in src:
                vecs.append(src[VECTOR_FIELD])
        pv = np.asarray(vecs, dtype=np.float32) if vecs and len(vecs) == len(hits) else None
        dense_scores: list[float] = []
        if qv is not None and pv is not None:
            dense_scores = (pv @ qv).tolist()
        if dense_top1 is None:
            dense_top1 = max(dense_scores) if dense_scores else math.nan
        bm25 = bm25 or {}
        return SearchResult(
            passages=passages,
            method=self.method,
            chunk_ids=[h["_id"] for h in hits],
            query_vector=qv,
            dense_top1=float(dense_top1),
            dense_scores=dense_scores,
            bm25_top1=max(bm25.values(), default=0.0),
            bm25_scores=[float(bm25.get(h["_id"], 0.0)) for h in hits],
            passage_vectors=pv,
        )
