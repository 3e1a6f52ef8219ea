"""Ingest into the embedded index: versioned directories, the CURRENT pointer, one
writer at a time, old versions collected (layout in `services.retriever.index`).

A writer builds a complete version in a temp directory, renames it into place and
then replaces CURRENT with os.replace (atomic on POSIX); readers never lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from services.retriever.bm25 import Bm25Config, build_bm25
from services.retriever.index import (
    BM25_DIR,
    CHUNKS_FILE,
    CURRENT_FILE,
    MANIFEST_FILE,
    VECTORS_FILE,
    Snapshot,
    encoder_name,
    load_current,
    read_current,
)
from services.retriever.indexing.chunking import collect_chunks
from services.retriever.indexing.report import IngestReport
from shared.encoders.embeddings import Encoder

LOCK_FILE = ".ingest.lock"
FORMAT_VERSION = 1
KEEP_VERSIONS = 3


def _version_name(version: int) -> str:
    return f"v{version:06d}"


def _write_current(index_dir: Path, name: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=index_dir, prefix=".CURRENT.")
    with os.fdopen(fd, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, index_dir / CURRENT_FILE)


@contextlib.contextmanager
def _ingest_lock(index_dir: Path) -> Iterator[None]:
    """One writer at a time per index directory (readers never lock)."""
    with open(index_dir / LOCK_FILE, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _gc_versions(index_dir: Path, keep: int, current: str) -> None:
    versions = sorted(p for p in index_dir.glob("v[0-9]*") if p.is_dir())
    for p in versions[:-keep]:
        if p.name != current:
            shutil.rmtree(p, ignore_errors=True)
    for p in index_dir.glob(".tmp-*"):  # leftovers of a crashed writer
        shutil.rmtree(p, ignore_errors=True)


def ingest(
    path: Path,
    index_dir: Path,
    encoder: Encoder,
    *,
    progress: bool = True,
    batch_size: int = 64,
    max_tokens: int = 128,
    overlap_tokens: int = 16,
) -> IngestReport:
    """Load, chunk, embed what changed, and publish a new index version atomically.

    Idempotent: a chunk whose id and content hash match the live version keeps its
    stored vector; chunks not produced any more are dropped. When nothing changed no
    version is written (replicas are not made to reload for nothing).
    """
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    index_dir = Path(index_dir)
    index_dir.mkdir(parents=True, exist_ok=True)
    bm25 = Bm25Config()

    docs, chunks = collect_chunks(Path(path), max_tokens, overlap_tokens)
    if not chunks:
        raise ValueError(f"no documents to index under {path} (.md, .txt, BEIR .jsonl)")
    seen_ids = {c.chunk_id for c in chunks}

    with _ingest_lock(index_dir):
        prev: Snapshot | None = None
        if read_current(index_dir) is not None:
            prev = load_current(index_dir)
        dim = int(encoder.dim)
        enc_id: dict[str, Any] = {"name": encoder_name(encoder), "dim": dim}
        same_encoder = prev is not None and prev.manifest.get("encoder") == enc_id
        prev_rows: dict[str, tuple[str, int]] = {}
        if prev is not None:
            prev_rows = {c.chunk_id: (c.content_hash, i) for i, c in enumerate(prev.chunks)}

        vectors = np.zeros((len(chunks), dim), dtype=np.float32)
        to_embed: list[int] = []
        added = updated = unchanged = 0
        for i, c in enumerate(chunks):
            old = prev_rows.get(c.chunk_id)
            if old is not None and old[0] == c.content_hash and same_encoder:
                assert prev is not None
                vectors[i] = prev.vectors[old[1]]
                unchanged += 1
            else:
                to_embed.append(i)
                if old is None:
                    added += 1
                else:
                    updated += 1
        removed = len(set(prev_rows) - seen_ids)

        same_bm25 = prev is not None and prev.manifest.get("bm25") == msgspec.to_builtins(bm25)
        same_order = prev is not None and [c.chunk_id for c in prev.chunks] == [
            c.chunk_id for c in chunks
        ]
        if not to_embed and not removed and same_bm25 and same_order:
            assert prev is not None
            secs = time.perf_counter() - t0
            return IngestReport(
                docs=docs, chunks=len(chunks), added=0, updated=0, unchanged=unchanged,
                removed=0, seconds=secs, chunks_per_s=len(chunks) / secs,
                docs_per_s=docs / secs, version=prev.version, changed=False,
            )

        t_embed = time.perf_counter()
        if to_embed:
            # Length-sorted batches pad less: MiniLM cost grows with the longest text in
            # a batch, so mixing a 20-token and a 250-token text wastes most of a row.
            order = sorted(to_embed, key=lambda i: len(chunks[i].indexed_text))
            bar = tqdm(total=len(order), desc="embedding", unit="chunk", disable=not progress)
            for s in range(0, len(order), batch_size):
                rows = order[s : s + batch_size]
                vecs = encoder.encode([chunks[i].indexed_text for i in rows], batch_size=batch_size)
                vectors[rows] = vecs
                bar.update(len(rows))
            bar.close()
        embed_secs = time.perf_counter() - t_embed

        retriever = build_bm25(chunks, bm25)
        version = (prev.version if prev else 0) + 1
        name = _version_name(version)
        tmp = Path(tempfile.mkdtemp(dir=index_dir, prefix=".tmp-"))
        np.save(tmp / VECTORS_FILE, vectors)
        (tmp / CHUNKS_FILE).write_bytes(msgspec.msgpack.encode(chunks))
        retriever.save(str(tmp / BM25_DIR), show_progress=False)

        secs = time.perf_counter() - t0
        report = IngestReport(
            docs=docs, chunks=len(chunks), added=added, updated=updated, unchanged=unchanged,
            removed=removed, seconds=secs, chunks_per_s=len(chunks) / secs if secs else 0.0,
            docs_per_s=docs / secs if secs else 0.0, embedded=len(to_embed),
            embed_seconds=embed_secs,
            embed_chunks_per_s=len(to_embed) / embed_secs if to_embed and embed_secs else 0.0,
            version=version, changed=True,
        )
        full_embed = msgspec.to_builtins(report) if len(to_embed) == len(chunks) else (
            prev.manifest.get("full_embed") if prev else None
        )
        manifest = {
            "format": FORMAT_VERSION,
            "version": version,
            "created_at": time.time(),
            "source": str(path),
            "encoder": enc_id,
            "bm25": msgspec.to_builtins(bm25),
            "chunking": {"max_tokens": max_tokens, "overlap_tokens": overlap_tokens},
            "counts": {"docs": docs, "chunks": len(chunks)},
            "last_ingest": msgspec.to_builtins(report),
            # Stats of the latest ingest that embedded every chunk (benchmarks read it
            # when the current run reused cached vectors).
            "full_embed": full_embed,
        }
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        os.replace(tmp, index_dir / name)
        _write_current(index_dir, name)
        _gc_versions(index_dir, KEEP_VERSIONS, name)
        return report
