"""Retrieval benchmarks on a BEIR dataset (SciFact) and the demo knowledge base.

    python -m bench.retrieval eval --beir /work/shared/data/scifact
    python -m bench.retrieval relevance --beir /work/shared/data/scifact
    python -m bench.retrieval ingest-speed --beir /work/shared/data/scifact --kb kb
    python -m bench.retrieval short-ingest [--kb kb/avap]
    python -m bench.retrieval fusion-cv --beir /work/shared/data/scifact [--test-qrels T]

`eval`, `relevance` and `short-ingest` run the retriever's offline evaluation
(`offline.retriever`; `intentroute eval retrieval` is `eval` with the
ingest encoder of `intentroute ingest`); `ingest-speed` is the embedding throughput
benchmark kept here. `short-ingest` is a full ingest, with the encoder `intentroute
ingest` uses, of knowledge-base chunks of at most 128 WordPiece tokens derived from
kb/avap into a throwaway index (`ingest_chunks_per_s` of the eval JSON). `fusion-cv`
chooses the hybrid's fusion by 5-fold cross-validation on the train qrels and scores
the choice on --test-qrels (`offline.retriever.fusion_cv`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from shared.encoders.embeddings import Encoder


def make_encoder(kind: str = "st") -> Encoder:
    """"st": sentence-transformers (the reference); "fast": shared.encoders.fast (same
    vectors, cosine >= 0.9999, less per-call overhead: the query-latency path)."""
    if kind == "fast":
        from shared.encoders.fast import FastEncoder

        return FastEncoder(threads=1, cache_size=0)  # no cache: every query pays
    from shared.encoders.embeddings import SentenceTransformerEncoder

    return SentenceTransformerEncoder()


def ingest_encoder() -> Encoder:
    """The encoder `intentroute ingest` uses (ONNX, 2 threads, settings' precision)."""
    from shared.common.settings import CommonSettings
    from shared.encoders.fast import batch_fast_encoder

    common = CommonSettings.from_env()
    return batch_fast_encoder(precision=common.ingest_precision,
                              onnx_cache_dir=common.onnx_cache_dir)


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
    from offline.retriever.evaluation import CACHE_ROOT
    from services.retriever.indexing.chunking import chunk_text
    from services.retriever.indexing.documents import load_documents
    from services.retriever.indexing.embedded_ingest import ingest
    from shared.encoders.embeddings import pin_threads

    pin_threads(1)
    enc = encoder if encoder is not None else make_encoder("st")
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
        CACHE_ROOT.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="kb-index-", dir=CACHE_ROOT))
        try:
            r = ingest(kb, tmp, enc, progress=False)
            out["kb"] = msgspec.to_builtins(r)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


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
    ap.add_argument("command",
                    choices=["eval", "relevance", "ingest-speed", "short-ingest", "fusion-cv"])
    ap.add_argument("--beir", help="BEIR dir (corpus.jsonl, queries.jsonl, qrels/train.tsv)")
    ap.add_argument("--corpus")
    ap.add_argument("--queries")
    ap.add_argument("--qrels")
    ap.add_argument("--test-qrels", type=Path, default=None,
                    help="fusion-cv: qrels scored with each choice, never used to choose")
    ap.add_argument("--methods", default="bm25,dense,hybrid")
    ap.add_argument("--index-dir", type=Path, default=None)
    ap.add_argument("--kb", type=Path, default=None, help="Markdown dir for ingest-speed")
    ap.add_argument("--n-docs", type=int, default=120, help="SciFact docs for ingest-speed")
    ap.add_argument("--encoder", choices=["st", "fast"], default="st",
                    help="query encoder: sentence-transformers or shared.encoders.fast")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--ingest-encoder", choices=["st", "fast"], default="fast",
                    help="short-ingest: sentence-transformers or the ingest encoder")
    args = ap.parse_args(argv)
    from offline.retriever.evaluation import DEMO_KB, evaluate, short_chunk_ingest
    from offline.retriever.relevance_calibration import relevance_report

    if args.command == "short-ingest":
        from shared.encoders.embeddings import pin_threads

        pin_threads(2)
        enc_i = ingest_encoder() if args.ingest_encoder == "fast" else make_encoder("st")
        print(json.dumps(short_chunk_ingest(args.kb or DEMO_KB, encoder=enc_i), indent=2))
        return
    corpus, queries, qrels = _paths(args)
    enc = make_encoder(args.encoder)
    if args.command == "eval":
        res = evaluate(corpus, queries, qrels, args.methods.split(","), args.index_dir,
                       ingest_encoder=enc, encoder=enc, progress=not args.no_progress)
        res["encoder"] = args.encoder
    elif args.command == "fusion-cv":
        from offline.retriever.fusion_cv import fusion_cv

        res = fusion_cv(corpus, queries, qrels, args.test_qrels, args.index_dir, encoder=enc,
                        progress=not args.no_progress)
    elif args.command == "relevance":
        res = relevance_report(corpus, queries, qrels, args.index_dir, encoder=enc,
                               progress=not args.no_progress)
    else:
        res = ingest_speed(corpus, args.kb, n_docs=args.n_docs, encoder=enc)
    print(json.dumps(res, indent=2, default=float))


if __name__ == "__main__":
    main()
