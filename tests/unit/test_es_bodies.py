"""Elasticsearch request bodies (pure functions, no cluster needed), and search and
ingest against an in-memory stand-in for the cluster."""

from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from services.retriever.es_backend import ElasticsearchRetrieval
from services.retriever.es_bodies import (
    BM25_FIELD,
    VECTOR_FIELD,
    build_bm25_query,
    build_knn_query,
    build_mapping,
    chunk_source,
    knn_score_to_cosine,
    version_hint,
)
from services.retriever.indexing.chunking import chunk_text
from services.retriever.indexing.es_ingest import ingest_es
from services.retriever.indexing.report import IngestReport


def test_mapping() -> None:
    m = build_mapping(384)
    props = m["mappings"]["properties"]
    vec = props[VECTOR_FIELD]
    assert vec == {
        "type": "dense_vector", "dims": 384, "index": True, "similarity": "cosine",
        "index_options": {"type": "hnsw", "m": 16, "ef_construction": 100},
    }
    assert props["text"]["copy_to"] == BM25_FIELD
    assert props["title"]["copy_to"] == BM25_FIELD
    assert props[BM25_FIELD]["analyzer"] == "english"
    for keyword in ("chunk_id", "doc_id", "source", "content_hash"):
        assert props[keyword]["type"] == "keyword"
    assert m["settings"]["number_of_shards"] == 1
    assert m["settings"]["index"]["similarity"]["default"] == {"type": "BM25", "k1": 1.2, "b": 0.75}
    with pytest.raises(ValueError, match="dims must be positive"):
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
    with pytest.raises(ValueError, match="num_candidates must be >= k"):
        build_knn_query([0.1], 10, 5)


def test_document_source_and_scores() -> None:
    (c,) = chunk_text("hello world", "a.txt", title="a")
    src = chunk_source(c, np.array([1.0, 0.0], dtype=np.float32))
    assert src["chunk_id"] == c.chunk_id
    assert src["content_hash"] == c.content_hash
    assert src[VECTOR_FIELD] == [1.0, 0.0]
    assert knn_score_to_cosine(1.0) == 1.0
    assert knn_score_to_cosine(0.5) == 0.0


def test_version_mismatch_hint() -> None:
    err = Exception("media_type_header_exception: Accept version must be either version 8 or 7")
    assert "pin elasticsearch" in str(version_hint(err))
    other = ValueError("x")
    assert version_hint(other) is other


# ---------------------------------------------------------------------------- backend
# The backend's own logic (ingest diff, client-side fusion, result shaping) against an
# in-memory stand-in for the cluster; the real cluster is tests/integration/test_es_backend.py.


class _FakeIndices:
    def __init__(self, es: "_FakeES") -> None:
        self.es = es

    async def exists(self, index: str) -> bool:
        return self.es.mapping is not None

    async def create(self, index: str, settings: dict, mappings: dict) -> None:
        self.es.mapping = mappings

    async def refresh(self, index: str) -> None:
        self.es.refreshes += 1


class _FakeES:
    def __init__(self) -> None:
        self.docs: dict[str, dict] = {}
        self.mapping: dict | None = None
        self.refreshes = 0
        self.searches: list[dict] = []
        self.indices = _FakeIndices(self)

    @staticmethod
    def _src(doc: dict, spec: object) -> dict | None:
        if spec is False:
            return None
        return {k: v for k, v in doc.items() if k in spec} if isinstance(spec, list) else doc

    def options(self, **_: object) -> "_FakeES":
        return self

    async def search(self, index: str, body: dict) -> dict:
        self.searches.append(body)
        hits: list[dict] = []
        if "knn" in body:
            qv = np.asarray(body["knn"]["query_vector"])
            for i, d in self.docs.items():
                cos = float(np.dot(qv, d[VECTOR_FIELD]))
                hits.append({"_id": i, "_score": (1 + cos) / 2})
        else:
            words = set(body["query"]["match"][BM25_FIELD]["query"].lower().split())
            for i, d in self.docs.items():
                n = sum(w in words for w in f"{d['title']} {d['text']}".lower().split())
                if n:
                    hits.append({"_id": i, "_score": float(n)})
        hits.sort(key=lambda h: (-h["_score"], h["_id"]))
        hits = hits[: body["size"]]
        for h in hits:
            src = self._src(self.docs[h["_id"]], body["_source"])
            if src is not None:
                h["_source"] = src
        return {"hits": {"hits": hits}}

    async def mget(self, index: str, ids: list[str]) -> dict:
        return {"docs": [{"_id": i, "found": i in self.docs, "_source": self.docs.get(i)}
                         for i in ids]}

    async def count(self, index: str) -> dict:
        return {"count": len(self.docs)}

    async def close(self) -> None:
        pass


class _UnitEncoder:
    """Maps a few words onto axes, so cosine is predictable."""

    model_name = "unit"
    dim = 3
    AXES: ClassVar[dict[str, int]] = {"loop": 0, "hash": 1, "sql": 2}

    def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        out = np.full((len(texts), 3), 0.01, dtype=np.float32)
        for i, t in enumerate(texts):
            for w, a in self.AXES.items():
                if w in t.lower():
                    out[i, a] += 1.0
        return out / np.linalg.norm(out, axis=1, keepdims=True)


@pytest.fixture
def fake_es(monkeypatch: pytest.MonkeyPatch) -> _FakeES:
    from elasticsearch import helpers

    es = _FakeES()

    async def fake_scan(client, index, query):  # type: ignore[no-untyped-def]
        for i, d in list(es.docs.items()):
            yield {"_id": i, "_source": {"content_hash": d["content_hash"],
                                         "source": d["source"]}}

    async def fake_bulk(client, actions, chunk_size=500):  # type: ignore[no-untyped-def]
        n = 0
        async for a in actions:
            if a["_op_type"] == "delete":
                es.docs.pop(a["_id"])
            else:
                es.docs[a["_id"]] = a["_source"]
            n += 1
        return n, []

    monkeypatch.setattr(helpers, "async_scan", fake_scan)
    monkeypatch.setattr(helpers, "async_bulk", fake_bulk)
    return es


def _retrieval(es: _FakeES, method: str) -> ElasticsearchRetrieval:
    return ElasticsearchRetrieval(es, _UnitEncoder(), method=method, index="t")


async def _ingest(es: _FakeES, path: Path, replace: bool = False) -> IngestReport:
    return await ingest_es(es, path, _UnitEncoder(), index="t", replace=replace,
                           progress=False)


async def test_ingest_is_incremental(fake_es, tmp_path) -> None:  # type: ignore[no-untyped-def]
    es = fake_es
    (tmp_path / "loops.txt").write_text("a loop repeats")
    (tmp_path / "hash.txt").write_text("hash a password")
    r1 = await _ingest(es, tmp_path)
    assert (r1.chunks, r1.added, r1.removed) == (2, 2, 0)
    assert es.mapping["properties"][VECTOR_FIELD]["dims"] == 3
    assert es.refreshes == 1
    r2 = await _ingest(es, tmp_path)
    assert (r2.added, r2.updated, r2.unchanged, r2.changed) == (0, 0, 2, False)
    assert es.refreshes == 1
    (tmp_path / "hash.txt").write_text("hash a password with sha256")
    (tmp_path / "loops.txt").unlink()
    (tmp_path / "db.txt").write_text("run sql")
    r3 = await _ingest(es, tmp_path)  # adds: the file gone from the folder stays
    assert (r3.added, r3.updated, r3.removed, r3.unchanged) == (1, 1, 0, 0)
    assert sorted(d["doc_id"] for d in es.docs.values()) == ["db.txt", "hash.txt", "loops.txt"]
    r4 = await _ingest(es, tmp_path, replace=True)
    assert (r4.added, r4.updated, r4.removed, r4.unchanged) == (0, 0, 1, 2)
    assert sorted(d["doc_id"] for d in es.docs.values()) == ["db.txt", "hash.txt"]


async def test_ingest_replaces_a_reread_files_chunks_only(  # type: ignore[no-untyped-def]
        fake_es, tmp_path) -> None:
    es = fake_es
    (tmp_path / "a.txt").write_text("a loop repeats " * 30 + "\n\n" + "hash a password " * 30)
    (tmp_path / "b.txt").write_text("run sql")
    await _ingest(es, tmp_path)
    assert len(es.docs) == 3  # a.txt is two chunks
    (tmp_path / "a.txt").write_text("a loop")
    r = await _ingest(es, tmp_path / "a.txt")
    assert (r.updated, r.removed, r.dropped) == (1, 0, 1)
    assert sorted(d["doc_id"] for d in es.docs.values()) == ["a.txt", "b.txt"]


async def test_search_fuses_client_side(fake_es, tmp_path) -> None:  # type: ignore[no-untyped-def]
    es = fake_es
    for name, text in {"loops.txt": "a loop repeats", "hash.txt": "hash a password",
                       "db.txt": "run sql"}.items():
        (tmp_path / name).write_text(text)
    await _ingest(es, tmp_path)
    es.searches.clear()
    res = await _retrieval(es, "hybrid").search("hash password", k=2)
    assert [s.get("knn") is not None for s in es.searches] == [False, True]
    assert all(s["_source"] is False for s in es.searches)  # ids only; mget the top k
    assert res.passages[0].doc_id == "hash.txt"
    # First in both: each method's best score over itself, weights 1 and 1.
    assert res.passages[0].score == pytest.approx(2.0)
    assert res.rrf_top1 == pytest.approx(2 / 61)
    assert res.dense_top1 == pytest.approx(res.dense_scores[0], abs=1e-5)
    # title "hash" + text "hash a password": three query-word hits in the fake scorer
    assert res.bm25_scores[0] == 3.0
    assert res.passage_vectors is not None
    assert res.passage_vectors.shape == (2, 3)
    bm25 = await _retrieval(es, "bm25").search("sql", k=3)
    assert [p.doc_id for p in bm25.passages] == ["db.txt"]
    assert bm25.query_vector is None
    dense = await _retrieval(es, "dense").search("loop", k=1)
    assert dense.passages[0].doc_id == "loops.txt"
    assert dense.passages[0].score > 0.9
    with pytest.raises(ValueError, match="method must be one of"):
        _retrieval(es, "sparse")
