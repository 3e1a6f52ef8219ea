"""Classifier benchmark: the embedding (Layer 2) figures.

* `embedding_latency(n)`: one message at a time through `Layer2Classifier.classify`
  (tokenise + encode + head), 1 thread, LRU cache off, distinct texts -> p50/p99 ms.
  `encoder="reference"` measures the sentence-transformers encoder instead.
* `micro_batch_throughput(concurrency, n)`: n submissions through `MicroBatcher`
  with `concurrency` callers in flight -> decisions/s.

The head is the one the package ships (`SHIPPED_HEADS`, what an empty registry is
seeded with) when present, else one trained on the fly from the classifier's training
file.

    python -m bench.classifier_embedding [--n 300] [--reference]
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "services" / "classifier" / "data" / "train.jsonl"

_FALLBACK_TEXTS = [
    "how do I paginate results from the orders endpoint",
    "write a function that validates an email address",
    "thanks, that worked",
    "what is my current API quota",
    "explain the difference between GET and POST",
    "generate a script that retries failed requests",
    "good morning!",
    "show me the usage of my project this month",
]


def texts_for_bench(n: int, corpus: str = "heldout") -> list[str]:
    """n distinct query-like texts (no cache hits).

    corpus "heldout": the queries of the routing evaluation sets (tests/data), which the
    head never saw; "project": the classifier's own training lines (mean ~17 tokens;
    in-sample, so an early-exit head is sure of nearly all); "clinc": CLINC150 test
    lines from ../shared/data (mean ~10 tokens, other domains).
    """
    base: list[str] = []
    clinc = REPO.parent / "shared" / "data" / "clinc150" / "data_full.json"
    if corpus == "heldout":
        trained = {json.loads(line)["text"] for line in
                   TRAIN.read_text(encoding="utf-8").splitlines() if line.strip()
                   } if TRAIN.exists() else set()
        for path in sorted((REPO / "tests" / "data").glob("routing_eval*.jsonl")):
            base += [q for line in path.read_text(encoding="utf-8").splitlines()
                     if line.strip() and (q := json.loads(line)["query"]) not in trained]
    elif corpus == "clinc" and clinc.exists():
        base = [t for t, _ in json.loads(clinc.read_text())["test"]]
    elif TRAIN.exists():
        for line in TRAIN.read_text(encoding="utf-8").splitlines():
            if line.strip():
                base.append(json.loads(line)["text"])
    base = list(dict.fromkeys(base)) or _FALLBACK_TEXTS  # repeats would hit the cache
    out: list[str] = []
    i = 0
    while len(out) < n:
        t = base[i % len(base)]
        out.append(t if i < len(base) else f"{t} ({i // len(base)})")
        i += 1
    return out


def _head() -> Any:
    from offline.classifier.labelled import load_labelled
    from offline.classifier.train import train_head
    from services.classifier.layer2.registry import SHIPPED_HEADS, HeadRegistry
    from shared.encoders.fast import shared_fast_encoder

    head = HeadRegistry(SHIPPED_HEADS).current() if SHIPPED_HEADS.exists() else None
    if head is not None:
        return head
    if TRAIN.exists():
        rows = load_labelled(TRAIN)
    else:
        rows = [(t, str(i % 4)) for i, t in enumerate(_FALLBACK_TEXTS * 4)]
    return train_head([t for t, _ in rows], [lab for _, lab in rows], shared_fast_encoder())


def _classifier(encoder: str = "fast", precision: str | None = None,
                early_exit: bool = True) -> Any:
    """Layer 2 as the worker runs it: the shipped head, at the encoder precision the
    head was trained with unless `precision` says otherwise (`early_exit=False`: the
    full encoder for every message)."""
    from services.classifier.layer2.classifier import Layer2Classifier
    from shared.encoders.embeddings import pin_threads

    pin_threads(1)
    head = _head()
    if not early_exit:
        head.early = None
    precision = precision or head.precision or "fp32"
    if encoder == "reference":
        from shared.encoders.embeddings import SentenceTransformerEncoder

        return Layer2Classifier(head, SentenceTransformerEncoder())
    from shared.encoders.fast import FastEncoder

    # No LRU cache on either encoder: every text is encoded.
    early = (FastEncoder(head.early.encoder, threads=1, cache_size=0, precision=precision,
                         layers=head.early.layers) if head.early is not None else None)
    if head.has_own_encoder:
        assert head.encoder_dir is not None
        return Layer2Classifier(head, FastEncoder(head.encoder_dir, cache_size=0,
                                                  precision=precision), early_encoder=early)
    return Layer2Classifier(
        head, FastEncoder(head.encoder, threads=1, cache_size=0, precision=precision),
        early_encoder=early,
    )


def embedding_latency(n: int = 300, *, encoder: str = "fast", warmup: int = 20,
                      corpus: str = "heldout", precision: str | None = None,
                      early_exit: bool = True) -> dict[str, Any]:
    """Single-message Layer 2 latency (encoder + head), wall-clock and CPU ms."""
    clf = _classifier(encoder, precision, early_exit)
    texts = texts_for_bench(n + warmup, corpus)
    for t in texts[:warmup]:
        clf.classify(t)
    wall, cpu, early = [], [], 0
    for t in texts[warmup:]:
        c0, w0 = time.thread_time(), time.perf_counter()
        early += clf.classify(t).early_exit
        wall.append((time.perf_counter() - w0) * 1000)
        cpu.append((time.thread_time() - c0) * 1000)
    return {
        "embedding_ms_p50": round(float(np.percentile(wall, 50)), 3),
        "embedding_ms_p99": round(float(np.percentile(wall, 99)), 3),
        "embedding_cpu_ms_p50": round(float(np.percentile(cpu, 50)), 3),
        # Share decided by the head's early exit (its shallow encoder) alone.
        "early_exit_share": round(early / len(wall), 4),
        "n": n,
        "encoder": encoder,
        "corpus": corpus,
        "precision": getattr(clf.encoder, "precision", "fp32"),
        "backend": getattr(clf.encoder, "backend", "sentence-transformers"),
    }


def micro_batch_throughput(concurrency: int = 64, n: int = 2000, *,
                           max_batch: int = 32, max_wait_ms: float = 2.0) -> dict[str, Any]:
    """Decisions/s through MicroBatcher with `concurrency` submissions in flight."""
    from services.classifier.layer2.batcher import MicroBatcher

    clf = _classifier("fast")
    texts = texts_for_bench(n)

    async def run() -> dict[str, Any]:
        batcher = MicroBatcher(clf, max_batch=max_batch, max_wait_ms=max_wait_ms)
        await batcher.submit("warm up")
        sem = asyncio.Semaphore(concurrency)
        lat: list[float] = []

        async def one(t: str) -> None:
            async with sem:
                s = time.perf_counter()
                await batcher.submit(t)
                lat.append((time.perf_counter() - s) * 1000)

        start = time.perf_counter()
        await asyncio.gather(*(one(t) for t in texts))
        elapsed = time.perf_counter() - start
        mean_batch = (batcher.items - 1) / max(1, batcher.batches - 1)
        await batcher.close()
        return {
            "decisions_per_s": round(n / elapsed, 1),
            "seconds": round(elapsed, 2),
            "mean_batch": round(mean_batch, 1),
            "max_batch": batcher.max_batch_seen,
            "latency_ms_p50": round(float(np.percentile(lat, 50)), 2),
            "latency_ms_p99": round(float(np.percentile(lat, 99)), 2),
            "concurrency": concurrency,
            "n": n,
        }

    return asyncio.run(run())


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--reference", action="store_true", help="also time the ST encoder")
    ap.add_argument("--throughput", type=int, default=2000)
    ap.add_argument("--corpus", choices=("heldout", "project", "clinc"),
                    default="heldout")
    ap.add_argument("--int8", action="store_true", help="also time the int8 fast encoder")
    args = ap.parse_args()
    print(json.dumps(embedding_latency(args.n, corpus=args.corpus), indent=1))
    if args.int8:
        print(json.dumps(embedding_latency(args.n, corpus=args.corpus, precision="int8"),
                         indent=1))
    if args.reference:
        print(json.dumps(embedding_latency(args.n, encoder="reference", corpus=args.corpus),
                         indent=1))
    if args.throughput:
        print(json.dumps(micro_batch_throughput(n=args.throughput), indent=1))
