"""Retrieval benchmark on a BEIR dataset (SciFact): quality, latency, ingestion, and
the relevance-check calibration of ADR-0009 Decision 2.

    python -m bench.retrieval eval --beir /work/shared/data/scifact
    python -m bench.retrieval relevance --beir /work/shared/data/scifact
    python -m bench.retrieval ingest-speed --beir /work/shared/data/scifact --kb kb
    python -m bench.retrieval short-ingest [--kb kb/avap]

`ingest_chunks_per_s` (in the eval JSON too) is a full ingest, with the encoder
`intentroute ingest` uses, of knowledge-base chunks of at most 128 WordPiece tokens
derived from kb/avap (see `short_chunks`) into a throwaway index.

The index (with its embeddings) is cached under /tmp/intentroute-bench/ and reused:
ingest is idempotent, so only the first run embeds the corpus.
"""

from __future__ import annotations

import argparse
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

from bench.ir_metrics import evaluate_run, ndcg_at_k
from shared.embeddings import Encoder

CACHE_ROOT = Path(tempfile.gettempdir()) / "intentroute-bench"
REPO = Path(__file__).resolve().parent.parent
DEMO_KB = REPO / "kb" / "avap"
SHORT_CHUNK_TOKENS = 128


# ---------------------------------------------------------------------------- data


def load_qrels(path: Path) -> dict[str, dict[str, int]]:
    """BEIR qrels TSV with a header line: query-id, corpus-id, score."""
    out: dict[str, dict[str, int]] = {}
    with Path(path).open(encoding="utf-8") as f:
        header = f.readline()
        if not header.lower().startswith("query"):
            raise ValueError(f"{path}: expected a 'query-id corpus-id score' header")
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 3:
                continue
            out.setdefault(parts[0], {})[parts[1]] = int(parts[2])
    return out


def load_queries(path: Path, only: set[str] | None = None) -> dict[str, str]:
    out: dict[str, str] = {}
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                qid = str(row["_id"])
                if only is None or qid in only:
                    out[qid] = row["text"]
    return out


def _pctl(values: Sequence[float], p: float) -> float:
    return float(np.percentile(np.asarray(values), p)) if values else math.nan


def _default_index_dir(corpus: Path) -> Path:
    return CACHE_ROOT / f"{Path(corpus).resolve().parent.name}-index"


def make_encoder(kind: str = "st") -> Encoder:
    """"st": sentence-transformers (what ingest used); "fast": shared.fast_encoder
    (same vectors, cosine >= 0.9999, less per-call overhead: the query-latency path)."""
    if kind == "fast":
        from shared.fast_encoder import FastEncoder

        return FastEncoder(threads=1, cache_size=0)  # no cache: every query pays
    from shared.embeddings import SentenceTransformerEncoder

    return SentenceTransformerEncoder()


def _encoder(encoder: Encoder | None) -> Encoder:
    return encoder if encoder is not None else make_encoder("st")


def ingest_encoder() -> Encoder:
    """The encoder `intentroute ingest` uses (ONNX fp32, 2 threads)."""
    from shared.fast_encoder import batch_fast_encoder

    return batch_fast_encoder()


def _doc_ranking(result: Any, k: int) -> list[str]:
    seen: list[str] = []
    for p in result.passages:
        if p.doc_id not in seen:
            seen.append(p.doc_id)
    return seen[:k]


def _open_index(corpus: Path, index_dir: Path | None, encoder: Encoder, progress: bool,
                ingest_with: Encoder | None = None) -> tuple[Any, Any, dict[str, Any]]:
    """Ingest (idempotent) with `ingest_with` (default: `encoder`), open for queries
    with `encoder`."""
    from services.retriever.index import EmbeddedIndex, ingest

    index_dir = index_dir or _default_index_dir(corpus)
    report = ingest(corpus, index_dir, ingest_with or encoder, progress=progress)
    index = EmbeddedIndex.open(index_dir, encoder)
    full = index.manifest.get("full_embed") or {}
    if report.changed and report.embedded == report.chunks:
        ingest_info = {"ingest_docs_per_s": report.docs_per_s, "ingest_cached": False}
    else:  # vectors came from the cache: report the run that embedded them
        ingest_info = {"ingest_docs_per_s": float(full.get("docs_per_s", math.nan)),
                       "ingest_cached": True}
    ingest_info["ingest"] = msgspec.to_builtins(report)
    return index, report, ingest_info


# ---------------------------------------------------------------------------- evaluate


def evaluate(
    corpus: Path,
    queries: Path,
    qrels: Path,
    methods: list[str],
    index_dir: Path | None = None,
    *,
    k: int = 10,
    encoder: Encoder | None = None,
    progress: bool = True,
    warmup: int = 5,
) -> dict[str, Any]:
    """nDCG/Recall/MRR@k per method on the queries present in qrels, plus ingest
    throughput (the corpus, and `short_chunk_ingest`) and hybrid query latency (query
    embedding included, 1 thread). Without `encoder`, the corpus is ingested with the
    encoder `intentroute ingest` uses and queried through sentence-transformers."""
    from shared.embeddings import pin_threads

    pin_threads(1)
    enc = _encoder(encoder)
    batch_enc = ingest_encoder() if encoder is None else enc
    index, _, ingest_info = _open_index(corpus, index_dir, enc, progress, batch_enc)
    short = short_chunk_ingest(encoder=batch_enc) if DEMO_KB.is_dir() else None
    judged = load_qrels(qrels)
    qs = load_queries(queries, set(judged))
    judged = {q: judged[q] for q in qs}

    for i in range(warmup):  # first calls pay for lazy init (distinct from eval queries)
        index.search(f"warm-up query number {i}", k=k, method="hybrid")
    runs: dict[str, dict[str, list[str]]] = {m: {} for m in methods}
    latencies: list[float] = []
    cpu_ms: list[float] = []
    for qid, text in qs.items():
        t, c = time.perf_counter(), time.thread_time()
        res = index.search(text, k=k, method="hybrid")
        latencies.append((time.perf_counter() - t) * 1000)
        # With 1 intra-op thread the encoder runs on this thread, so thread CPU time is
        # the latency an idle core would give (wall time includes waiting for a core
        # when other processes share the 2 cores).
        cpu_ms.append((time.thread_time() - c) * 1000)
        qv = res.query_vector
        for m in methods:
            r = res if m == "hybrid" else index.search(text, k=k, method=m, query_vector=qv)
            runs[m][qid] = _doc_ranking(r, k)

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
        "query_ms_p50": _pctl(latencies, 50),
        "query_ms_p95": _pctl(latencies, 95),
        "query_cpu_ms_p50": _pctl(cpu_ms, 50),
        "query_cpu_ms_p95": _pctl(cpu_ms, 95),
        "load_avg_1m": os.getloadavg()[0],
        "bm25_config": index.manifest["bm25"],
    })
    return out


# ---------------------------------------------------------------------------- relevance


def relevance_report(
    corpus: Path,
    queries: Path,
    qrels: Path,
    index_dir: Path | None = None,
    *,
    encoder: Encoder | None = None,
    strategies: Sequence[str] = ("broaden", "prf", "both"),
    signal: str | None = None,
    threshold: float | None = None,
    folds: int = 5,
    progress: bool = True,
) -> dict[str, Any]:
    """AUC of each relevance signal for telling nDCG@10 == 0 queries from the rest
    (hybrid retrieval), the calibrated threshold of the best one, how often it fires,
    and what the one reformulation retry does to nDCG@10 on the queries it fires on."""
    from services.retriever.index import rrf
    from services.retriever.reformulate import reformulate_with_hint
    from services.retriever.relevance import (
        SIGNALS,
        calibrate,
        relevance_signal,
    )
    from shared.embeddings import pin_threads

    pin_threads(1)
    enc = _encoder(encoder)
    index, _, _ = _open_index(corpus, index_dir, enc, progress)
    judged = load_qrels(qrels)
    qs = load_queries(queries, set(judged))

    qids = list(qs)
    results = {q: index.search(qs[q], k=10, method="hybrid") for q in qids}
    ndcg = np.array([ndcg_at_k(_doc_ranking(results[q], 10), judged[q]) for q in qids])
    bad = ndcg == 0
    sig = {name: np.array([relevance_signal(results[q], name) for q in qids])
           for name in SIGNALS}

    per_signal: dict[str, Any] = {}
    for name, vals in sig.items():
        ok = ~np.isnan(vals)
        thr, auc = calibrate(vals[ok].tolist(), bad[ok].tolist())
        fires = vals < thr
        per_signal[name] = {
            "auc": auc,
            "youden_threshold": thr,
            "fire_rate": float(fires.mean()),
            "tpr": float((fires & bad).sum() / bad.sum()),
            "fpr": float((fires & ~bad).sum() / (~bad).sum()),
        }
    chosen = signal or max(per_signal, key=lambda s: per_signal[s]["auc"])
    thr = threshold if threshold is not None else per_signal[chosen]["youden_threshold"]
    vals = sig[chosen]
    fires = vals < thr

    # Out-of-fold check of the threshold (the in-sample J is optimistic).
    rng = np.random.default_rng(0)
    fold_of = rng.permutation(len(qids)) % folds
    oof_fire = np.zeros(len(qids), dtype=bool)
    for f in range(folds):
        tr = fold_of != f
        t_f, _ = calibrate(vals[tr].tolist(), bad[tr].tolist())
        oof_fire[~tr] = vals[~tr] < t_f
    cv = {
        "folds": folds,
        "fire_rate": float(oof_fire.mean()),
        "tpr": float((oof_fire & bad).sum() / bad.sum()),
        "fpr": float((oof_fire & ~bad).sum() / (~bad).sum()),
    }

    retry: dict[str, Any] = {}
    fired_ids = [q for q, f in zip(qids, fires, strict=True) if f]
    base = {q: n for q, n in zip(qids, ndcg, strict=True)}
    for strategy in strategies:
        deltas: dict[str, list[float]] = {"replace": [], "fuse": []}
        for q in fired_ids:
            first = results[q]
            new_q = reformulate_with_hint(qs[q], first.passages[:3], strategy=strategy)
            second = _doc_ranking(index.search(new_q, k=10, method="hybrid"), 10)
            # "replace" is ADR-0009 as written (generate on the second retrieval);
            # "fuse" keeps what the first retrieval found and lets the retry add to it.
            fused = [d for d, _ in rrf([_doc_ranking(first, 10), second])][:10]
            deltas["replace"].append(ndcg_at_k(second, judged[q]) - base[q])
            deltas["fuse"].append(ndcg_at_k(fused, judged[q]) - base[q])
        for mode, values in deltas.items():
            d = np.array(values)
            retry[f"{strategy}/{mode}"] = {
                "fired": len(d),
                "improved": float((d > 1e-9).mean()) if len(d) else 0.0,
                "worse": float((d < -1e-9).mean()) if len(d) else 0.0,
                "unchanged": float((np.abs(d) <= 1e-9).mean()) if len(d) else 0.0,
                "mean_delta_ndcg": float(d.mean()) if len(d) else 0.0,
                "ndcg_all_queries_after": float(
                    (ndcg.sum() + d.sum()) / len(qids)) if len(d) else float(ndcg.mean()),
            }
    return {
        "queries": len(qids),
        "hybrid_ndcg@10": float(ndcg.mean()),
        "share_ndcg0": float(bad.mean()),
        "signals": per_signal,
        "chosen_signal": chosen,
        "threshold": thr,
        "fire_rate": float(fires.mean()),
        "fired_precision": float((fires & bad).sum() / max(1, fires.sum())),
        "cross_validated": cv,
        "retry": retry,
    }


# ---------------------------------------------------------------------------- ingest speed


def ingest_speed(
    corpus: Path,
    kb: Path | None = None,
    *,
    n_docs: int = 120,
    batch_sizes: Sequence[int] = (16, 64),
    encoder: Encoder | None = None,
) -> dict[str, Any]:
    """Embedding throughput on chunks of <= 128 tokens (SciFact abstracts split like
    plain text), length-sorted vs file order, per batch size; and a full ingest of
    `kb` (Markdown) into a throwaway index."""
    from services.retriever.index import ingest
    from services.retriever.ingest import chunk_text, load_documents
    from shared.embeddings import pin_threads

    pin_threads(1)
    enc = _encoder(encoder)
    chunks = []
    for i, doc in enumerate(load_documents(corpus)):
        if i >= n_docs:
            break
        chunks.extend(chunk_text(doc.text, doc.source, 128, 16, title=doc.title))
    texts = [c.indexed_text for c in chunks]
    enc.encode(texts[:8])  # warm-up
    out: dict[str, Any] = {"chunks": len(texts), "docs": n_docs,
                           "load_avg_1m": os.getloadavg()[0]}
    for bs in batch_sizes:
        for sort in (False, True):
            order = sorted(texts, key=len) if sort else texts
            t, c = time.perf_counter(), time.thread_time()
            for s in range(0, len(order), bs):
                enc.encode(order[s : s + bs], batch_size=bs)
            secs, cpu = time.perf_counter() - t, time.thread_time() - c
            key = f"bs{bs}_{'sorted' if sort else 'unsorted'}"
            out[f"{key}_chunks_per_s"] = len(texts) / secs
            # 1 intra-op thread: CPU time of this thread ~ wall time on an idle core.
            out[f"{key}_chunks_per_cpu_s"] = len(texts) / cpu
    if kb is not None:
        tmp = Path(tempfile.mkdtemp(prefix="kb-index-", dir=CACHE_ROOT))
        try:
            r = ingest(kb, tmp, enc, progress=False)
            out["kb"] = msgspec.to_builtins(r)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def short_chunks(kb: Path = DEMO_KB, max_tokens: int = SHORT_CHUNK_TOKENS,
                 bounds: Sequence[int] = (128, 96, 64, 48, 32)) -> list[str]:
    """Distinct knowledge-base chunks of at most `max_tokens` WordPiece tokens.

    `kb` is chunked as `ingest` does at several size bounds (more distinct chunks than
    one chunking gives) and chunks longer than `max_tokens` real tokens are dropped:
    the chunker's words x 1.3 estimate undercounts AVAP code.
    """
    import tokenizers

    from services.retriever.ingest import iter_chunks
    from shared.embeddings import DEFAULT_MODEL, resolve_model_path

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


def short_chunk_ingest(kb: Path = DEMO_KB, *, encoder: Encoder | None = None) -> dict[str, Any]:
    """Full ingest (load, embed, BM25, write) of `short_chunks(kb)` into a throwaway
    index, one chunk per document, with the ingest encoder -> chunks/s."""
    from services.retriever.index import ingest

    enc = encoder if encoder is not None else ingest_encoder()
    texts = short_chunks(kb)
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="short-ingest-", dir=CACHE_ROOT))
    try:
        corpus = tmp / "corpus.jsonl"
        with corpus.open("w", encoding="utf-8") as f:
            for i, text in enumerate(texts):
                f.write(json.dumps({"_id": f"c{i}", "title": "", "text": text}) + "\n")
        enc.encode([t for t in texts[:8]])  # warm-up (lazy init) outside the timing
        r = ingest(corpus, tmp / "index", enc, progress=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "ingest_chunks_per_s": r.chunks_per_s,
        "embed_chunks_per_s": r.embed_chunks_per_s,
        "chunks": r.chunks,
        "max_tokens": SHORT_CHUNK_TOKENS,
        "encoder": type(enc).__name__,
        "encoder_threads": getattr(enc, "_threads", None),
        "load_avg_1m": os.getloadavg()[0],
    }


# ---------------------------------------------------------------------------- CLI


def _paths(args: argparse.Namespace) -> tuple[Path, Path, Path]:
    beir = Path(args.beir) if args.beir else None
    corpus = Path(args.corpus) if args.corpus else (beir / "corpus.jsonl" if beir else None)
    queries = Path(args.queries) if args.queries else (beir / "queries.jsonl" if beir else None)
    qrels = Path(args.qrels) if args.qrels else (beir / "qrels" / "train.tsv" if beir else None)
    if not (corpus and queries and qrels):
        raise SystemExit("give --beir DIR or --corpus/--queries/--qrels")
    return corpus, queries, qrels


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.retrieval", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["eval", "relevance", "ingest-speed", "short-ingest"])
    ap.add_argument("--beir", help="BEIR dir (corpus.jsonl, queries.jsonl, qrels/train.tsv)")
    ap.add_argument("--corpus")
    ap.add_argument("--queries")
    ap.add_argument("--qrels")
    ap.add_argument("--methods", default="bm25,dense,hybrid")
    ap.add_argument("--index-dir", type=Path, default=None)
    ap.add_argument("--kb", type=Path, default=None, help="Markdown dir for ingest-speed")
    ap.add_argument("--n-docs", type=int, default=120, help="SciFact docs for ingest-speed")
    ap.add_argument("--encoder", choices=["st", "fast"], default="st",
                    help="query encoder: sentence-transformers or shared.fast_encoder")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--ingest-encoder", choices=["st", "fast"], default="fast",
                    help="short-ingest: sentence-transformers or the ingest encoder")
    args = ap.parse_args(argv)
    if args.command == "short-ingest":
        from shared.embeddings import pin_threads

        pin_threads(2)
        enc_i = ingest_encoder() if args.ingest_encoder == "fast" else make_encoder("st")
        print(json.dumps(short_chunk_ingest(args.kb or DEMO_KB, encoder=enc_i), indent=2))
        return
    corpus, queries, qrels = _paths(args)
    enc = make_encoder(args.encoder)
    if args.command == "eval":
        res = evaluate(corpus, queries, qrels, args.methods.split(","), args.index_dir,
                       encoder=enc, progress=not args.no_progress)
        res["encoder"] = args.encoder
    elif args.command == "relevance":
        res = relevance_report(corpus, queries, qrels, args.index_dir, encoder=enc,
                               progress=not args.no_progress)
    else:
        res = ingest_speed(corpus, args.kb, n_docs=args.n_docs, encoder=enc)
    print(json.dumps(res, indent=2, default=float))


if __name__ == "__main__":
    main()
