"""Elasticsearch backend against a real cluster.

Runs when ES_URL points at an Elasticsearch 8.x/9.x server, or when testcontainers
can start one on a local Docker engine; otherwise the module is skipped with the
reason. Uses a deterministic hashing encoder so no model is loaded here.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("elasticsearch")

from services.retriever.es_backend import ElasticsearchRetrieval
from services.retriever.indexing.es_ingest import ingest_es
from services.retriever.indexing.report import IngestReport
from services.retriever.ports import Retrieval
from shared.encoders.embeddings import Vectors

ES_IMAGE = os.environ.get("ES_IMAGE", "docker.elastic.co/elasticsearch/elasticsearch:8.15.3")


class HashingEncoder:
    """Bag-of-words hashed into 64 dims, L2-normalised: enough to make knn meaningful."""

    model_name = "hashing-64"
    dim = 64

    def encode(self, texts: list[str], batch_size: int = 32) -> Vectors:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"\w+", t.lower()):
                out[i, int(hashlib.md5(w.encode()).hexdigest(), 16) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return (out / np.where(norms == 0, 1, norms)).astype(np.float32)


def _docker_available() -> str | None:
    """None if a Docker engine answers, else why not."""
    try:
        import docker
    except ImportError:
        return "the docker SDK is not installed"
    try:
        docker.from_env(timeout=3).ping()
    except Exception as e:  # no socket, permission denied, daemon down
        return f"no Docker engine reachable ({type(e).__name__})"
    return None


@pytest.fixture(scope="module")
def es_url() -> Iterator[str]:
    url = os.environ.get("ES_URL")
    if url:
        yield url
        return
    why = _docker_available()
    if why:
        pytest.skip(f"Elasticsearch integration test needs ES_URL or a Docker engine: {why}")
    try:
        from testcontainers.community.elasticsearch import ElasticSearchContainer
    except ImportError:
        from testcontainers.elasticsearch import ElasticSearchContainer  # testcontainers < 4.15
    with ElasticSearchContainer(ES_IMAGE, mem_limit="1g") as es:
        yield es.get_url()  # type: ignore[attr-defined]


@pytest.fixture
async def backend(es_url: str) -> AsyncIterator[ElasticsearchRetrieval]:
    b = ElasticsearchRetrieval.from_url(es_url, HashingEncoder(), method="hybrid",
                                        index=f"test-{uuid.uuid4().hex}")
    yield b
    await b.client.indices.delete(index=b.index, ignore_unavailable=True)
    await b.close()


async def test_ingest_search_update_delete(backend: ElasticsearchRetrieval,
                                           tmp_path: Path) -> None:
    assert isinstance(backend, Retrieval)
    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "loops.md").write_text("# Loops\n\n## startLoop\n\nstartLoop repeats a loop body.\n")
    (kb / "crypto.md").write_text("# Hashing\n\n## encodeSHA256\n\nencodeSHA256 hashes a value.\n")
    (kb / "db.md").write_text("# Database\n\n## ormDirect\n\normDirect runs SQL on a database.\n")

    async def ingest(replace: bool = False) -> IngestReport:
        return await ingest_es(backend.client, kb, HashingEncoder(), index=backend.index,
                               replace=replace, progress=False)

    async def count() -> int:
        return int((await backend.client.count(index=backend.index))["count"])

    def searcher(method: str) -> ElasticsearchRetrieval:
        return ElasticsearchRetrieval(backend.client, HashingEncoder(), method=method,
                                      index=backend.index)

    r1 = await ingest()
    assert (r1.chunks, r1.added, r1.removed) == (3, 3, 0)
    assert await count() == 3
    for method in ("bm25", "dense", "hybrid"):
        res = await searcher(method).search("encodeSHA256 hashes", k=2)
        assert res.passages[0].doc_id == "crypto.md", method
    res = await backend.search("encodeSHA256 hashes", k=2)
    assert res.passage_vectors is not None
    assert len(res.dense_scores) == len(res.passages)

    r2 = await ingest()
    assert (r2.added, r2.updated, r2.removed, r2.unchanged) == (0, 0, 0, 3)

    (kb / "db.md").write_text("# Database\n\n## ormDirect\n\normDirect runs SQL queries.\n")
    (kb / "loops.md").unlink()
    r3 = await ingest()  # adds: the file gone from the folder stays indexed
    assert (r3.updated, r3.removed, r3.dropped, r3.unchanged) == (1, 0, 0, 1)
    assert await count() == 3
    r4 = await ingest(replace=True)
    assert (r4.updated, r4.removed, r4.unchanged) == (0, 1, 2)
    assert await count() == 2
    res = await searcher("bm25").search("startLoop loop", k=3)
    assert all(p.doc_id != "loops.md" for p in res.passages)
