"""Elasticsearch request bodies (pure functions, no cluster needed)."""

import numpy as np
import pytest

from services.retriever.es_backend import (
    BM25_FIELD,
    VECTOR_FIELD,
    _version_hint,
    build_bm25_query,
    build_knn_query,
    build_mapping,
    build_rrf_retriever_query,
    chunk_source,
    knn_score_to_cosine,
)
from services.retriever.ingest import chunk_text


def test_mapping() -> None:
    m = build_mapping(384)
    props = m["mappings"]["properties"]
    vec = props[VECTOR_FIELD]
    assert vec == {
        "type": "dense_vector", "dims": 384, "index": True, "similarity": "cosine",
        "index_options": {"type": "hnsw", "m": 16, "ef_construction": 100},
    }
    assert props["text"]["copy_to"] == BM25_FIELD and props["title"]["copy_to"] == BM25_FIELD
    assert props[BM25_FIELD]["analyzer"] == "english"
    for keyword in ("chunk_id", "doc_id", "source", "content_hash"):
        assert props[keyword]["type"] == "keyword"
    assert m["settings"]["number_of_shards"] == 1
    assert m["settings"]["index"]["similarity"]["default"] == {"type": "BM25", "k1": 1.2, "b": 0.75}
    with pytest.raises(ValueError):
        build_mapping(0)


def test_bm25_query() -> None:
    body = build_bm25_query("how do loops work", 8)
    assert body["size"] == 8
    assert body["query"] == {"match": {BM25_FIELD: {"query": "how do loops work"}}}
    assert VECTOR_FIELD not in body["_source"]
    assert build_bm25_query("q", 100, with_source=False)["_source"] is False


def test_knn_query() -> None:
    body = build_knn_query(np.array([0.5, -0.25], dtype=np.float32), 10, 50)
    assert body["size"] == 10
    assert body["knn"] == {"field": VECTOR_FIELD, "query_vector": [0.5, -0.25], "k": 10,
                           "num_candidates": 50}
    assert all(type(x) is float for x in body["knn"]["query_vector"])  # JSON-serialisable
    assert VECTOR_FIELD in body["_source"]
    with pytest.raises(ValueError):
        build_knn_query([0.1], 10, 5)


def test_server_side_rrf_body() -> None:
    body = build_rrf_retriever_query("q", [1.0, 0.0], k=8, depth=100, rank_constant=60)
    rrf = body["retriever"]["rrf"]
    assert body["size"] == 8 and rrf["rank_window_size"] == 100 and rrf["rank_constant"] == 60
    standard, knn = rrf["retrievers"]
    assert standard["standard"]["query"]["match"][BM25_FIELD]["query"] == "q"
    assert knn["knn"]["k"] == 100 and knn["knn"]["num_candidates"] == 200


def test_document_source_and_scores() -> None:
    (c,) = chunk_text("hello world", "a.txt", title="a")
    src = chunk_source(c, np.array([1.0, 0.0], dtype=np.float32))
    assert src["chunk_id"] == c.chunk_id and src["content_hash"] == c.content_hash
    assert src[VECTOR_FIELD] == [1.0, 0.0]
    assert knn_score_to_cosine(1.0) == 1.0 and knn_score_to_cosine(0.5) == 0.0


def test_version_mismatch_hint() -> None:
    err = Exception("media_type_header_exception: Accept version must be either version 8 or 7")
    assert "pin elasticsearch" in str(_version_hint(err))
    other = ValueError("x")
    assert _version_hint(other) is other
