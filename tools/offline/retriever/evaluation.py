"""Retrieval quality on a BEIR dataset (SciFact): nDCG/Recall/MRR@k per method, hybrid
query latency, and ingest speed (the corpus, and `short_chunk_ingest`).

The index (with its embeddings) is cached under /tmp/intentroute-bench/ and reused:
ingest is idempotent, so only the first run embeds the corpus.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from offline.retriever.beir import load_qrels, load_queries
from offline.retriever.ranking_metrics import evaluate_run
from services.retriever.fusion import Fusion, FusionSettings
from services.retriever.index import EmbeddedIndex
from services.retriever.indexing.embedded_ingest import ingest
from services.retriever.ports import SearchResult
from shared.encoders.embeddings import Encoder

CACHE_ROOT = Path(tempfile.gettempdir()) / "intentroute-bench"
DEMO_KB = Path(__file__).resolve().parents[3] / "kb" / "avap"
SHORT_CHUNK_TOKENS = 128


def percentile(values: Sequence[float], p: float) -> float:
    return float(np.percentile(np.asarray(values), p)) if values else math.nan


def doc_ranking(result: SearchResult, k: int) -> list[str]:
    """Document ids of a result, best first, each once (BEIR judges documents)."""
    seen: list[str] = []
    for p in result.passages:
        if p.doc_id not in seen:
            seen.append(p.doc_id)
    return seen[:k]


def open_index(corpus: Path, index_dir: Path | None, encoder: Encoder, progress: bool,
               ingest_with: Encoder | None = None, fusion: FusionSettings | None = None
               ) -> tuple[EmbeddedIndex, dict[str, Any]]:
    """Ingest (idempotent) with `ingest_with` (default: `encoder`), open for queries
    with `encoder` (hybrids fused by `fusion`, default the shipped one); with the
    ingest's speed, or that of the run that embedded the cached vectors."""
    index_dir = index_dir or CACHE_ROOT / f"{Path(corpus).resolve().parent.name}-index"
    report = ingest(corpus, index_dir, ingest_with or encoder, replace=True,
                    progress=progress)
    index = EmbeddedIndex.open(index_dir, encoder, fusion)
    full = index.manifest.get("full_embed") or {}
    if report.changed and report.embedded == report.chunks:
        ingest_info: dict[str, Any] = {"ingest_docs_per_s": report.docs_per_s,
                                       "ingest_cached": False}
    else:  # vectors came from the cache: report the run that embedded them
        ingest_info = {"ingest_docs_per_s": float(full.get("docs_per_s", math.nan)),
                       "ingest_cached": True}
    ingest_info["ingest"] = msgspec.to_builtins(report)
    return index, ingest_info


def sentence_transformer() -> Encoder:
    """The reference query encoder of the published figures."""
    from shared.encoders.embeddings import SentenceTransformerEncoder

    return SentenceTransformerEncoder()


def evaluate(
    corpus: Path,
    queries: Path,
    qrels: Path,
    methods: list[str],
    index_dir: Path | None = None,
    *,
    ingest_encoder: Encoder,
    encoder: Encoder | None = None,
    k: int = 10,
    progress: bool = True,
    warmup: int = 5,
    short_kb: Path | None = DEMO_KB,
    fusion: FusionSettings | None = None,
) -> dict[str, Any]:
    """nDCG/Recall/MRR@k per method on the queries present in qrels, plus ingest
    throughput (the corpus, and `short_chunk_ingest` of `short_kb`) and hybrid query
    latency (query embedding included, 1 thread). The corpus is ingested with
    `ingest_encoder` and queried with `encoder` (default: sentence-transformers).
    "hybrid" fuses as `fusion` says (default: the shipped fusion); "rrf" is the hybrid
    with plain RRF (k=60, equal weights), the reference it is measured against."""
    from shared.encoders.embeddings import pin_threads

    pin_threads(1)
    enc = encoder if encoder is not None else sentence_transformer()
    index, ingest_info = open_index(corpus, index_dir, enc, progress, ingest_encoder, fusion)
    plain_rrf = FusionSettings(method=Fusion.RRF)
    short = None
    if short_kb is not None and short_kb.is_dir():
        short = short_chunk_ingest(short_kb, encoder=ingest_encoder)
    judged = load_qrels(qrels)
    qs = load_queries(queries, set(judged))
    judged = {q: judged[q] for q in qs}

    for i in range(warmup):  # first calls pay for lazy init (distinct from eval queries)
        index.search(f"warm-up query number {i}", k, "hybrid")
    runs: dict[str, dict[str, list[str]]] = {m: {} for m in methods}
    latencies: list[float] = []
    cpu_ms: list[float] = []
    for qid, text in qs.items():
        t, c = time.perf_counter(), time.thread_time()
        res = index.search(text, k, "hybrid")
        latencies.append((time.perf_counter() - t) * 1000)
        # With 1 intra-op thread the encoder runs on this thread, so thread CPU time is
        # the latency an idle core would give (wall time includes waiting for a core
        # when other processes share the 2 cores).
        cpu_ms.append((time.thread_time() - c) * 1000)
        qv = res.query_vector
        for m in methods:
            if m == "hybrid":
                r = res
            elif m == "rrf":
                r = index.search(text, k, "hybrid", query_vector=qv, fusion=plain_rrf)
            else:
                r = index.search(text, k, m, query_vector=qv)
            runs[m][qid] = doc_ranking(r, k)

    out: dict[str, Any] = {}
    for m in methods:
        out[m] = evaluate_run(runs[m], judged, k)
    out.update({
        "queries": len(qs),
        "chunks": len(index),
        "index_version": index.version,
        "ingest_docs_per_s": ingest_info["ingest_docs_per_s"],
        "ingest_cached": ingest_info["ingest_cached"],
        "ingest_chunks_per_s": short["ingest_chunks_per_s"] if short else math.nan,
        "ingest_short_chunks": short,
        "query_ms_p50": percentile(latencies, 50),
        "query_ms_p95": percentile(latencies, 95),
        "query_cpu_ms_p50": percentile(cpu_ms, 50),
        "query_cpu_ms_p95": percentile(cpu_ms, 95),
        "load_avg_1m": os.getloadavg()[0],
        "bm25_config": index.manifest["bm25"],
        "fusion": msgspec.to_builtins(index.settings),
    })
    return out


def short_chunks(kb: Path = DEMO_KB, max_tokens: int = SHORT_CHUNK_TOKENS,
                 bounds: Sequence[int] = (128, 96, 64, 48, 32)) -> list[str]:
    """Distinct knowledge-base chunks of at most `max_tokens` WordPiece tokens.

    `kb` is chunked as `ingest` does at several size bounds (more distinct chunks than
    one chunking gives) and chunks longer than `max_tokens` real tokens are dropped:
    the chunker's words x 1.3 estimate undercounts AVAP code.
    """
    import tokenizers

    from services.retriever.indexing.chunking import iter_chunks
    from shared.encoders.embeddings import DEFAULT_MODEL, resolve_model_path

    tok = tokenizers.Tokenizer.from_file(
        str(Path(resolve_model_path(DEFAULT_MODEL)) / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    seen: set[str] = set()
    out: list[str] = []
    for bound in bounds:
        for c in iter_chunks(kb, max_tokens=bound, overlap_tokens=16):
            text = c.indexed_text
            if text not in seen and len(tok.encode(text).ids) <= max_tokens:
                seen.add(text)
                out.append(text)
    return out


def short_chunk_ingest(kb: Path = DEMO_KB, *, encoder: Encoder) -> dict[str, Any]:
    """Full ingest (load, embed, BM25, write) of `short_chunks(kb)` into a throwaway
    index, one chunk per document, with `encoder` (the ingest encoder) -> chunks/s."""
    texts = short_chunks(kb)
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="short-ingest-", dir=CACHE_ROOT))
    try:
        corpus = tmp / "corpus.jsonl"
        with corpus.open("w", encoding="utf-8") as f:
            for i, text in enumerate(texts):
                f.write(json.dumps({"_id": f"c{i}", "title": "", "text": text}) + "\n")
        encoder.encode(list(texts[:8]))  # warm-up (lazy init) outside the timing
        r = ingest(corpus, tmp / "index", encoder, progress=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "ingest_chunks_per_s": r.chunks_per_s,
        "embed_chunks_per_s": r.embed_chunks_per_s,
        "chunks": r.chunks,
        "max_tokens": SHORT_CHUNK_TOKENS,
        "encoder": type(encoder).__name__,
        "encoder_threads": getattr(encoder, "_threads", None),
        "load_avg_1m": os.getloadavg()[0],
    }
