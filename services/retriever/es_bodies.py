"""Elasticsearch index mapping and request bodies (pure functions), and the wrapper
every client call goes through, shared by search (`es_backend`) and ingest
(`indexing.es_ingest`).

One index holds each chunk with its text (BM25, `english` analyzer: Porter stemming +
Lucene English stopwords, like the embedded bm25s setup) and a `dense_vector`
(cosine, HNSW).

Client/server versions: elasticsearch-py 9.x always sends
`Accept: application/vnd.elasticsearch+json; compatible-with=9`, which Elasticsearch
8.x rejects with 400 media_type_header_exception. Against an 8.x server pin
`elasticsearch[async]>=8.13,<9` (8.x clients also work with 9.x servers).
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from services.retriever.indexing.chunking import Chunk

T = TypeVar("T")

DEFAULT_INDEX = "intentroute-kb"  # RetrieverSettings.es_index default
VECTOR_FIELD = "embedding"
BM25_FIELD = "content"  # title + text via copy_to, matching the embedded indexed_text
_SOURCE_FIELDS = ["chunk_id", "doc_id", "title", "text", "source", "content_hash"]


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


def version_hint(exc: Exception) -> Exception:
    """A clearer error for a client/server major version mismatch; other errors as they are."""
    msg = str(exc)
    if "media_type_header_exception" in msg or "compatible-with" in msg:
        return RuntimeError(
            "Elasticsearch rejected the client's compatibility header: a 9.x Python client "
            "cannot talk to an 8.x server; pin elasticsearch[async]>=8.13,<9"
        )
    return exc


async def call(request: Awaitable[T]) -> T:
    """Await a client call, turning a version-mismatch rejection into `version_hint`."""
    try:
        return await request
    except Exception as e:
        hint = version_hint(e)
        if hint is e:
            raise
        raise hint from e
