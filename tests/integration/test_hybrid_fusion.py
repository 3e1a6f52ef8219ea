"""The hybrid's fusion on a real index with the real encoder: the shipped score fusion
adds each method's score over its best, RETRIEVER_FUSION=rrf gives Reciprocal Rank
Fusion in the worker, and `eval retrieval` reports the hybrid beside plain RRF."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from offline.retriever.evaluation import evaluate
from services.retriever.bootstrap import build_retrieval
from services.retriever.fusion import Fusion, FusionSettings
from services.retriever.index import EmbeddedIndex
from services.retriever.indexing.embedded_ingest import ingest
from services.retriever.settings import RetrieverSettings

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

DOCS = [
    ("d1", "Loops", "startLoop repeats the body once for every value of a counter."),
    ("d2", "Hashing", "encodeSHA256 computes the SHA-256 digest of a password."),
    ("d3", "Database", "ormDirect runs an SQL statement against the database."),
    ("d4", "HTTP", "RequestGet sends an HTTP GET request to a web service."),
    ("d5", "Counters", "A loop counter counts upward by one from the first value."),
]
QUERIES = {"q1": "how do I repeat something with a loop counter",
           "q2": "store a password digest", "q3": "run SQL on the database"}
QRELS = {"q1": "d1", "q2": "d2", "q3": "d3"}


@pytest.fixture(scope="module")
def minilm() -> object:
    from shared.encoders.embeddings import SentenceTransformerEncoder, pin_threads

    pin_threads(1)
    return SentenceTransformerEncoder()


@pytest.fixture
def beir(tmp_path: Path) -> Path:
    root = tmp_path / "beir"
    root.mkdir()
    with (root / "corpus.jsonl").open("w") as f:
        for doc_id, title, text in DOCS:
            f.write(json.dumps({"_id": doc_id, "title": title, "text": text}) + "\n")
    with (root / "queries.jsonl").open("w") as f:
        for qid, text in QUERIES.items():
            f.write(json.dumps({"_id": qid, "text": text}) + "\n")
    (root / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t1\n" for q, d in QRELS.items()))
    return root


def test_the_hybrid_adds_each_methods_score_over_its_best(minilm: object, beir: Path,
                                                          tmp_path: Path) -> None:
    ingest(beir / "corpus.jsonl", tmp_path / "index", minilm, progress=False)  # type: ignore[arg-type]
    index = EmbeddedIndex.open(tmp_path / "index", minilm)  # type: ignore[arg-type]
    res = index.search("a loop counter that counts upward", 5, "hybrid")
    # Five chunks, 100 hits per method: every chunk's two scores are known.
    assert len(res.passages) == 5
    expected = [b / res.bm25_top1 + d / res.dense_top1
                for b, d in zip(res.bm25_scores, res.dense_scores, strict=True)]
    assert [p.score for p in res.passages] == pytest.approx(expected, abs=1e-5)
    assert expected == sorted(expected, reverse=True)
    # The relevance check still reads the first passage's RRF score.
    plain = index.search("a loop counter that counts upward", 5, "hybrid",
                         fusion=FusionSettings(method=Fusion.RRF))
    assert 1 / 62 <= res.rrf_top1 <= 2 / 61
    assert plain.passages[0].score == pytest.approx(plain.rrf_top1)
    assert plain.passages[0].score <= 2 / 61


async def test_the_worker_fuses_as_its_settings_say(minilm: object, beir: Path,
                                                    tmp_path: Path) -> None:
    ingest(beir / "corpus.jsonl", tmp_path / "index", minilm, progress=False)  # type: ignore[arg-type]
    env = {"INDEX_DIR": str(tmp_path / "index")}
    shipped = build_retrieval(RetrieverSettings.from_env(env))
    plain = build_retrieval(RetrieverSettings.from_env({**env, "RETRIEVER_FUSION": "rrf"}))
    weighted = build_retrieval(RetrieverSettings.from_env(
        {**env, "RETRIEVER_BM25_WEIGHT": "0", "RETRIEVER_DENSE_WEIGHT": "3"}))
    query = "store a password digest"
    first = (await shipped.search(query, 3)).passages[0]
    assert first.doc_id == "d2"
    assert 1.0 < first.score <= 2.0  # the best of one method, and more than nothing of the other
    assert (await plain.search(query, 3)).passages[0].score <= 2 / 61
    # BM25 weighted 0: the order and score are the dense one's, 3 x cosine / best cosine.
    dense_only = await weighted.search(query, 3)
    assert dense_only.passages[0].score == pytest.approx(3.0)
    assert dense_only.dense_scores == sorted(dense_only.dense_scores, reverse=True)
    for backend in (shipped, plain, weighted):
        await backend.close()


def test_eval_reports_the_hybrid_beside_plain_rrf(minilm: object, beir: Path,
                                                  tmp_path: Path) -> None:
    def run(fusion: FusionSettings | None) -> dict[str, object]:
        return evaluate(beir / "corpus.jsonl", beir / "queries.jsonl", beir / "qrels.tsv",
                        ["bm25", "dense", "hybrid", "rrf"], tmp_path / "index",
                        ingest_encoder=minilm, encoder=minilm,  # type: ignore[arg-type]
                        progress=False, warmup=1, short_kb=None, fusion=fusion)

    shipped = run(None)
    assert shipped["fusion"] == {"method": "score", "rrf_k": 60, "bm25_weight": 1.0,
                                 "dense_weight": 1.0, "depth": 100}
    assert shipped["queries"] == 3
    for method in ("bm25", "dense", "hybrid", "rrf"):
        assert shipped[method]["ndcg@10"] > 0.5, method  # type: ignore[index]
    # Asked to fuse with plain RRF, the hybrid is the `rrf` reference exactly.
    as_rrf = run(FusionSettings(method=Fusion.RRF))
    assert as_rrf["fusion"]["method"] == "rrf"  # type: ignore[index]
    assert as_rrf["hybrid"] == as_rrf["rrf"] == shipped["rrf"]


def test_a_wrong_method_or_fusion_is_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RETRIEVER_", "INTENTROUTE_"))}
    env.update(INTENTROUTE_HOME=str(tmp_path), PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    base = [sys.executable, "-m", "intentroute.cli", "eval", "retrieval", "--corpus", "c",
            "--queries", "q", "--qrels", "r"]

    def one_line(args: list[str], **extra: str) -> str:
        done = subprocess.run(args, env={**env, **extra}, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 2, done.stderr
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, done.stderr
        return lines[0]

    assert "bm25, dense, hybrid, rrf or all" in one_line([*base, "--method", "sparse"])
    assert one_line(base, RETRIEVER_FUSION="best") == (
        "RETRIEVER_FUSION: expected score or rrf, got 'best'")
