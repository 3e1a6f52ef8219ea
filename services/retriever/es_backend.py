"""Elasticsearch backend behind the same async search interface as the embedded one.

One index holds each chunk with its text (BM25, `english` analyzer: Porter stemming +
Lucene English stopwords, like the embedded bm25s setup) and a `dense_vector`
(cosine, HNSW). Hybrid = a BM25 `match` search and a `knn` search run concurrently and
fused client-side with the same `rrf()` as the embedded index: this works on the free
Basic license. The server-side `retriever.rrf` API (ES >= 8.14) needs an Enterprise
license on 8.x; `build_rrf_retriever_query` builds it for clusters that have one
(`server_rrf=True`).

Client/server versions: elasticsearch-py 9.x always sends
`Accept: application/vnd.elasticsearch+json; compatible-with=9`, which Elasticsearch
8.x rejects with 400 media_type_header_exception. Against an 8.x server pin
`elasticsearch[async]>=8.13,<9` (8.x clients also work with 9.x servers).

Unlike the embedded backend, an ES ingest is applied in place (bulk upserts and
deletes, then one refresh), so a concurrent search may see a partly updated index
for the duration of the bulk; `maybe_reload` has nothing to do.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from services.retriever.index import (
    METHODS,
    TOP_K,
    IngestReport,
    RetrievalSettings,
    SearchResult,
    rrf,
)
from services.retriever.ingest import Chunk, chunk_document, load_documents
from shared.contracts.pipeline import Passage
from shared.embeddings import Encoder

DEFAULT_INDEX = "intentroute-kb"  # RetrieverSettings.es_index default
VECTOR_FIELD = "embedding"
BM25_FIELD = "content"  # title + text via copy_to, matching the embedded indexed_text
_SOURCE_FIELDS = ["chunk_id", "doc_id", "title", "text", "source", "content_hash"]


# ---------------------------------------------------------------------------- bodies


def build_mapping(dims: int) -> dict[str, Any]:
    """Index settings + mappings (pass as `settings=` / `mappings=` to indices.create)."""
    if dims <= 0:
        raise ValueError("dims must be positive")
    return {
        "settings": {
            "number_of_shards": 1,  # one shard: BM25 statistics are exact, not per-shard
            "number_of_replicas": 0,
            "index": {"similarity": {"default": {"type": "BM25", "k1": 1.2, "b": 0.75}}},
        },
        "mappings": {
            "dynamic": "strict",
            "properties": {
                "chunk_id": {"type": "keyword"},
                "doc_id": {"type": "keyword"},
                "title": {"type": "text", "analyzer": "english", "copy_to": BM25_FIELD},
                "text": {"type": "text", "analyzer": "english", "copy_to": BM25_FIELD},
                BM25_FIELD: {"type": "text", "analyzer": "english"},
                "source": {"type": "keyword"},
                "content_hash": {"type": "keyword"},
                VECTOR_FIELD: {
                    "type": "dense_vector",
                    "dims": dims,
                    "index": True,
                    "similarity": "cosine",
                    # Plain float HNSW: 8.14+ defaults to int8 quantisation, which would
                    # make dense scores differ from the embedded backend's.
                    "index_options": {"type": "hnsw", "m": 16, "ef_construction": 100},
                },
            },
        },
    }


def build_bm25_query(query: str, k: int, *, with_source: bool = True) -> dict[str, Any]:
    return {
        "size": k,
        "query": {"match": {BM25_FIELD: {"query": query}}},
        "_source": _SOURCE_FIELDS if with_source else False,
    }


def build_knn_query(
    vector: Sequence[float] | npt.NDArray[np.float32],
    k: int,
    num_candidates: int,
    *,
    with_source: bool = True,
) -> dict[str, Any]:
    if num_candidates < k:
        raise ValueError("num_candidates must be >= k")
    return {
        "size": k,
        "knn": {
            "field": VECTOR_FIELD,
            "query_vector": [float(x) for x in vector],
            "k": k,
            "num_candidates": num_candidates,
        },
        "_source": [*_SOURCE_FIELDS, VECTOR_FIELD] if with_source else False,
    }


def build_rrf_retriever_query(
    query: str,
    vector: Sequence[float] | npt.NDArray[np.float32],
    k: int,
    depth: int,
    rank_constant: int = 60,
) -> dict[str, Any]:
    """Server-side RRF (retrievers API, ES >= 8.14; Enterprise license on 8.x)."""
    return {
        "size": k,
        "retriever": {
            "rrf": {
                "retrievers": [
                    {"standard": {"query": {"match": {BM25_FIELD: {"query": query}}}}},
                    {"knn": {"field": VECTOR_FIELD, "query_vector": [float(x) for x in vector],
                             "k": depth, "num_candidates": 2 * depth}},
                ],
                "rank_window_size": depth,
                "rank_constant": rank_constant,
            }
        },
        "_source": [*_SOURCE_FIELDS, VECTOR_FIELD],
    }


def chunk_source(chunk: Chunk, vector: Sequence[float] | npt.NDArray[np.float32]
                 ) -> dict[str, Any]:
    return {
        "chunk_id": chunk.chunk_id,
        "doc_id": chunk.doc_id,
        "title": chunk.title,
        "text": chunk.text,
        "source": chunk.source,
        "content_hash": chunk.content_hash,
        VECTOR_FIELD: [float(x) for x in vector],
    }


def knn_score_to_cosine(score: float) -> float:
    """ES reports cosine similarity as (1 + cos) / 2 so scores stay positive."""
    return 2.0 * float(score) - 1.0


def _version_hint(exc: Exception) -> Exception:
    msg = str(exc)
    if "media_type_header_exception" in msg or "compatible-with" in msg:
        return RuntimeError(
            "Elasticsearch rejected the client's compatibility header: a 9.x Python client "
            "cannot talk to an 8.x server; pin elasticsearch[async]>=8.13,<9"
        )
    return exc


# ---------------------------------------------------------------------------- backend


class ElasticsearchBackend:
    """RetrievalBackend on Elasticsearch (official async client)."""

    def __init__(
        self,
        client: Any,
        encoder: Encoder | None,
        *,
        index: str = DEFAULT_INDEX,
        settings: RetrievalSettings | None = None,
        server_rrf: bool = False,
        num_candidates_factor: float = 2.0,
    ) -> None:
        self.client = client
        self.encoder = encoder
        self.index = index
        self.settings = settings or RetrievalSettings()
        self.server_rrf = server_rrf
        self.num_candidates_factor = num_candidates_factor

    @classmethod
    def from_url(cls, url: str, encoder: Encoder | None, **kwargs: Any) -> ElasticsearchBackend:
        from elasticsearch import AsyncElasticsearch

        client_kwargs = kwargs.pop("client_kwargs", {})
        return cls(AsyncElasticsearch(url, **client_kwargs), encoder, **kwargs)

    async def close(self) -> None:
        await self.client.close()

    async def maybe_reload(self) -> bool:
        return False  # the cluster always serves the latest refresh

    async def _call(self, coro: Any) -> Any:
        try:
            return await coro
        except Exception as e:
            hint = _version_hint(e)
            if hint is e:
                raise
            raise hint from e

    async def ensure_index(self, dims: int) -> bool:
        """Create the index if missing; True if it was created."""
        if await self._call(self.client.indices.exists(index=self.index)):
            return False
        body = build_mapping(dims)
        await self._call(self.client.indices.create(
            index=self.index, settings=body["settings"], mappings=body["mappings"]))
        return True

    async def count(self) -> int:
        resp = await self._call(self.client.count(index=self.index))
        return int(resp["count"])

    async def _existing(self) -> dict[str, str]:
        from elasticsearch import helpers

        out: dict[str, str] = {}
        async for hit in helpers.async_scan(
            self.client, index=self.index,
            query={"query": {"match_all": {}}, "_source": ["content_hash"]},
        ):
            out[hit["_id"]] = hit["_source"].get("content_hash", "")
        return out

    async def ingest(
        self,
        path: Path,
        *,
        progress: bool = True,
        batch_size: int = 64,
        max_tokens: int = 128,
        overlap_tokens: int = 16,
    ) -> IngestReport:
        """Idempotent by chunk_id + content_hash; deletes chunks whose documents are gone."""
        from elasticsearch import helpers
        from tqdm.auto import tqdm

        if self.encoder is None:
            raise RuntimeError("ingest needs an encoder")
        encoder = self.encoder
        t0 = time.perf_counter()
        docs = 0
        chunks: dict[str, Chunk] = {}
        for doc in load_documents(Path(path)):
            docs += 1
            for c in chunk_document(doc, max_tokens, overlap_tokens):
                chunks.setdefault(c.chunk_id, c)
        await self.ensure_index(encoder.dim)
        existing = await self._existing()

        todo = [c for cid, c in chunks.items() if existing.get(cid) != c.content_hash]
        added = sum(1 for c in todo if c.chunk_id not in existing)
        updated = len(todo) - added
        gone = [cid for cid in existing if cid not in chunks]
        todo.sort(key=lambda c: len(c.indexed_text))  # less padding per batch

        embed_secs = 0.0

        async def actions() -> AsyncIterator[dict[str, Any]]:
            nonlocal embed_secs
            bar = tqdm(total=len(todo), desc="embedding", unit="chunk", disable=not progress)
            for s in range(0, len(todo), batch_size):
                batch = todo[s : s + batch_size]
                t = time.perf_counter()
                vecs = await asyncio.to_thread(
                    encoder.encode, [c.indexed_text for c in batch], batch_size)
                embed_secs += time.perf_counter() - t
                for c, v in zip(batch, vecs, strict=True):
                    yield {"_op_type": "index", "_index": self.index, "_id": c.chunk_id,
                           "_source": chunk_source(c, v)}
                bar.update(len(batch))
            bar.close()
            for cid in gone:
                yield {"_op_type": "delete", "_index": self.index, "_id": cid}

        if todo or gone:
            await self._call(helpers.async_bulk(self.client, actions(), chunk_size=500))
            await self._call(self.client.indices.refresh(index=self.index))
        secs = time.perf_counter() - t0
        return IngestReport(
            docs=docs, chunks=len(chunks), added=added, updated=updated,
            unchanged=len(chunks) - len(todo), removed=len(gone), seconds=secs,
            chunks_per_s=len(chunks) / secs if secs else 0.0,
            docs_per_s=docs / secs if secs else 0.0, embedded=len(todo),
            embed_seconds=embed_secs,
            embed_chunks_per_s=len(todo) / embed_secs if embed_secs else 0.0,
            changed=bool(todo or gone),
        )

    # -- search --------------------------------------------------------------

    async def _search(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        resp = await self._call(self.client.search(index=self.index, body=body))
        return list(resp["hits"]["hits"])

    def _num_candidates(self, k: int) -> int:
        return max(k, int(math.ceil(k * self.num_candidates_factor)))

    async def search(
        self,
        query: str,
        k: int = TOP_K,
        method: str = "hybrid",
        query_vector: npt.NDArray[np.float32] | None = None,
    ) -> SearchResult:
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        qv = query_vector
        if qv is None and method != "bm25":
            if self.encoder is None:
                raise RuntimeError("dense/hybrid search needs an encoder or query_vector")
            enc = self.encoder
            qv = (await asyncio.to_thread(enc.encode, [query], 1))[0]
        qv_arr = None if qv is None else np.asarray(qv, dtype=np.float32)

        if method == "bm25":
            hits = await self._search(build_bm25_query(query, k))
            return self._result(method, hits, [h["_score"] for h in hits], qv_arr,
                                bm25={h["_id"]: h["_score"] for h in hits})
        assert qv_arr is not None
        if method == "dense":
            hits = await self._search(build_knn_query(qv_arr, k, self._num_candidates(k)))
            cos = [knn_score_to_cosine(h["_score"]) for h in hits]
            return self._result(method, hits, cos, qv_arr, dense_top1=cos[0] if cos else None)

        depth = max(self.settings.depth, k)
        if self.server_rrf:
            hits = await self._search(build_rrf_retriever_query(
                query, qv_arr, k, depth, self.settings.rrf_k))
            return self._result(method, hits, [h["_score"] for h in hits], qv_arr)
        b_hits, d_hits = await asyncio.gather(
            self._search(build_bm25_query(query, depth, with_source=False)),
            self._search(build_knn_query(qv_arr, depth, self._num_candidates(depth),
                                         with_source=False)),
        )
        fused = rrf(
            [[h["_id"] for h in b_hits], [h["_id"] for h in d_hits]],
            k=self.settings.rrf_k,
            weights=[self.settings.bm25_weight, self.settings.dense_weight],
        )[:k]
        ids = [i for i, _ in fused]
        docs: list[dict[str, Any]] = []
        if ids:
            resp = await self._call(self.client.mget(index=self.index, ids=ids))
            docs = [d for d in resp["docs"] if d.get("found")]
        score_of = dict(fused)
        dense_top1 = knn_score_to_cosine(d_hits[0]["_score"]) if d_hits else None
        return self._result(method, docs, [score_of[d["_id"]] for d in docs], qv_arr,
                            bm25={h["_id"]: h["_score"] for h in b_hits},
                            dense_top1=dense_top1)

    def _result(
        self,
        method: str,
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
            method=method,
            chunk_ids=[h["_id"] for h in hits],
            query_vector=qv,
            dense_top1=float(dense_top1),
            dense_scores=dense_scores,
            bm25_top1=max(bm25.values(), default=0.0),
            bm25_scores=[float(bm25.get(h["_id"], 0.0)) for h in hits],
            passage_vectors=pv,
        )


# The brief's name for the same thing.
ElasticsearchIndex = ElasticsearchBackend


class ElasticsearchRetrieval:
    """Adapter to the worker's `Retrieval` port (services/retriever/adapters.py):
    `search(query, k) -> SearchResult`, built from RetrieverSettings."""

    def __init__(self, backend: ElasticsearchBackend, method: str = "hybrid") -> None:
        self.backend = backend
        self.method = method

    @classmethod
    def from_settings(cls, settings: Any) -> ElasticsearchRetrieval:
        encoder: Encoder | None = None
        if settings.method != "bm25":
            from shared.embeddings import SentenceTransformerEncoder, pin_threads

            pin_threads(1)
            encoder = SentenceTransformerEncoder(settings.embedding_model)
        backend = ElasticsearchBackend.from_url(settings.es_url, encoder, index=settings.es_index)
        return cls(backend, settings.method)

    async def search(self, query: str, k: int) -> SearchResult:
        return await self.backend.search(query, k, self.method)

    async def maybe_reload(self) -> bool:
        return await self.backend.maybe_reload()

    async def close(self) -> None:
        await self.backend.close()
