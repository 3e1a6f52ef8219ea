"""Ingest into the embedded index: versioned directories, the CURRENT pointer, one
writer at a time, old versions collected (layout in `services.retriever.index`).

An ingest adds: each source file it reads replaces that file's chunks, every other
source stays (`replace=True`: the index becomes what was read). The manifest's
`sources` says which files are indexed, with their chunks and when they last changed.

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

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
from services.retriever.indexing.chunking import Chunk, collect_chunks
from services.retriever.indexing.documents import Skipped, source_file
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
    replace: bool = False,
    progress: bool = True,
    batch_size: int = 64,
    max_tokens: int = 128,
    overlap_tokens: int = 16,
    confirm: Callable[[int, float | None], bool] | None = None,
) -> IngestReport:
    """Load, chunk, embed what changed, and publish a new index version atomically.

    The files read replace their own chunks and the other sources stay (`replace`: the
    index holds only what was read). Idempotent: a chunk whose id and content hash match
    the live version keeps its stored vector. When nothing changed no version is
    written (replicas are not made to reload for nothing). Counts are of the chunks
    read; `removed` (chunks of the previous version gone) is 0 unless `replace`,
    `dropped` counts the chunks a re-read file no longer has. Files that cannot be read
    as text are skipped and named in the report (`skipped`). `confirm(chunks to embed,
    the last full embed's chunks/s or None)` is asked before embedding: False ends the
    ingest (IngestDeclinedError) with nothing changed.
    """
    t0 = time.perf_counter()
    index_dir = Path(index_dir)
    index_dir.mkdir(parents=True, exist_ok=True)
    bm25 = Bm25Config()

    skipped: list[Skipped] = []
    docs, read = collect_chunks(Path(path), max_tokens, overlap_tokens, skipped)
    if not read:
        why = "; ".join(f"{s.file}: {s.reason}" for s in skipped[:5])
        raise ValueError(f"no documents to index under {path} (.md, .txt, BEIR .jsonl)"
                         + (f"; skipped {why}" if why else ""))

    with _ingest_lock(index_dir):
        prev: Snapshot | None = None
        if read_current(index_dir) is not None:
            prev = load_current(index_dir)
        dim = int(encoder.dim)
        enc_id: dict[str, Any] = {"name": encoder_name(encoder), "dim": dim}
        chunks = read if replace or prev is None else _merge(read, prev.chunks)
        plan = _plan(chunks, prev, enc_id, dim, {c.chunk_id for c in read})
        removed, dropped = (plan.removed, 0) if replace else (0, plan.removed)
        if prev is not None and _nothing_changed(plan, prev, chunks, bm25):
            secs = time.perf_counter() - t0
            return IngestReport(
                docs=docs, chunks=len(read), added=0, updated=0, unchanged=plan.unchanged,
                removed=0, seconds=secs, chunks_per_s=len(read) / secs,
                docs_per_s=docs / secs, version=prev.version, changed=False,
                skipped=skipped,
            )
        if confirm is not None and not confirm(len(plan.to_embed), _last_rate(prev)):
            raise IngestDeclinedError("ingest not started: nothing changed")

        t_embed = time.perf_counter()
        _embed(chunks, plan, encoder, batch_size=batch_size, progress=progress)
        embed_secs = time.perf_counter() - t_embed

        version = (prev.version if prev else 0) + 1
        tmp = _stage_version(index_dir, chunks, plan.vectors, bm25)
        secs = time.perf_counter() - t0
        embedded = len(plan.to_embed)
        report = IngestReport(
            docs=docs, chunks=len(read), added=plan.added, updated=plan.updated,
            unchanged=plan.unchanged, removed=removed, dropped=dropped, seconds=secs,
            chunks_per_s=len(read) / secs if secs else 0.0,
            docs_per_s=docs / secs if secs else 0.0, embedded=embedded,
            embed_seconds=embed_secs,
            embed_chunks_per_s=embedded / embed_secs if embedded and embed_secs else 0.0,
            version=version, changed=True, skipped=skipped,
        )
        full_embed = msgspec.to_builtins(report) if embedded == len(read) == len(chunks) else (
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
            "counts": {"docs": len({c.doc_id for c in chunks}), "chunks": len(chunks)},
            "sources": _sources(chunks, read, prev, str(Path(path).resolve())),
            "last_ingest": msgspec.to_builtins(report),
            # Stats of the latest ingest that embedded every chunk (benchmarks read it
            # when the current run reused cached vectors).
            "full_embed": full_embed,
        }
        _publish(index_dir, tmp, manifest, _version_name(version))
        return report


class IngestDeclinedError(Exception):
    """The person asked before a long ingest said no."""


def _last_rate(prev: Snapshot | None) -> float | None:
    """Chunks embedded per second by the last ingest that embedded every chunk."""
    full = prev.manifest.get("full_embed") if prev is not None else None
    rate = full.get("embed_chunks_per_s") if isinstance(full, dict) else None
    return float(rate) if rate else None


@dataclass
class _Plan:
    """The new version's vectors (those kept filled in), the rows still to embed, and the
    counts of chunks added, updated, unchanged and removed."""

    vectors: npt.NDArray[np.float32]
    to_embed: list[int] = field(default_factory=list)
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    removed: int = 0


def _merge(read: list[Chunk], live: list[Chunk]) -> list[Chunk]:
    """The live chunks with each source file read in place of its old chunks (where its
    first one was, so re-reading the same files keeps the order); new files last."""
    by_file: dict[str, list[Chunk]] = {}
    for c in read:
        by_file.setdefault(source_file(c.source), []).append(c)
    out: list[Chunk] = []
    placed: set[str] = set()
    for c in live:
        key = source_file(c.source)
        if key not in by_file:
            out.append(c)
        elif key not in placed:
            out.extend(by_file[key])
            placed.add(key)
    for key, cs in by_file.items():
        if key not in placed:
            out.extend(cs)
    return out


def _sources(chunks: list[Chunk], read: list[Chunk], prev: Snapshot | None, root: str
             ) -> dict[str, dict[str, Any]]:
    """Source file -> its chunks, when its chunks last changed and the path it was
    ingested from (a file read again unchanged keeps its time)."""
    def signature(cs: list[Chunk]) -> dict[str, set[tuple[str, str]]]:
        out: dict[str, set[tuple[str, str]]] = {}
        for c in cs:
            out.setdefault(source_file(c.source), set()).add((c.chunk_id, c.content_hash))
        return out

    old = list_sources_of(prev) if prev is not None else {}
    old_sig = signature(prev.chunks) if prev is not None else {}
    read_sig = signature(read)
    now = time.time()
    out: dict[str, dict[str, Any]] = {}
    for key, sig in signature(chunks).items():
        entry = {"chunks": len(sig), "ingested_at": now, "from": root}
        if key in old and (key not in read_sig or old_sig.get(key) == sig):
            entry = {**old[key], "chunks": len(sig)}
        out[key] = entry
    return out


def list_sources_of(snap: Snapshot) -> dict[str, dict[str, Any]]:
    """The snapshot's source files (`chunks`, `ingested_at`, `from`); a version written
    before sources were recorded gets its own time and path for each."""
    recorded = snap.manifest.get("sources")
    if isinstance(recorded, dict):
        return recorded
    out: dict[str, dict[str, Any]] = {}
    for c in snap.chunks:
        entry = out.setdefault(source_file(c.source), {
            "chunks": 0, "ingested_at": snap.manifest.get("created_at"),
            "from": snap.manifest.get("source")})
        entry["chunks"] += 1
    return out


def list_sources(index_dir: Path) -> dict[str, dict[str, Any]]:
    """What the live version of `index_dir` holds, by source file (empty: no index)."""
    if read_current(Path(index_dir)) is None:
        return {}
    return list_sources_of(load_current(Path(index_dir)))


def _plan(chunks: list[Chunk], prev: Snapshot | None, enc_id: dict[str, Any], dim: int,
          counted: set[str]) -> _Plan:
    """Against the live version: a chunk whose id and content hash match it (same encoder)
    keeps its stored vector; the others are to embed (new id: added, new content:
    updated; counted only for the ids in `counted`, those read); ids it has that are
    not in `chunks` any more are removed."""
    same_encoder = prev is not None and prev.manifest.get("encoder") == enc_id
    prev_rows: dict[str, tuple[str, int]] = {}
    if prev is not None:
        prev_rows = {c.chunk_id: (c.content_hash, i) for i, c in enumerate(prev.chunks)}

    plan = _Plan(np.zeros((len(chunks), dim), dtype=np.float32))
    for i, c in enumerate(chunks):
        old = prev_rows.get(c.chunk_id)
        count = c.chunk_id in counted
        if old is not None and old[0] == c.content_hash and same_encoder:
            assert prev is not None
            plan.vectors[i] = prev.vectors[old[1]]
            plan.unchanged += count
        else:
            plan.to_embed.append(i)
            if old is None:
                plan.added += count
            else:
                plan.updated += count
    plan.removed = len(set(prev_rows) - {c.chunk_id for c in chunks})
    return plan


def _nothing_changed(plan: _Plan, prev: Snapshot, chunks: list[Chunk], bm25: Bm25Config
                     ) -> bool:
    """True when the live version already is this one: nothing to embed or drop, the same
    BM25 settings and the same chunk order."""
    same_bm25 = prev.manifest.get("bm25") == msgspec.to_builtins(bm25)
    same_order = [c.chunk_id for c in prev.chunks] == [c.chunk_id for c in chunks]
    return not plan.to_embed and not plan.removed and same_bm25 and same_order


def _embed(chunks: list[Chunk], plan: _Plan, encoder: Encoder, *, batch_size: int,
           progress: bool) -> None:
    """Embed the plan's rows into its vectors. Length-sorted batches pad less: MiniLM cost
    grows with the longest text in a batch, so mixing a 20-token and a 250-token text
    wastes most of a row."""
    if not plan.to_embed:
        return
    from tqdm.auto import tqdm

    order = sorted(plan.to_embed, key=lambda i: len(chunks[i].indexed_text))
    bar = tqdm(total=len(order), desc="embedding", unit="chunk", disable=not progress)
    for s in range(0, len(order), batch_size):
        rows = order[s : s + batch_size]
        vecs = encoder.encode([chunks[i].indexed_text for i in rows], batch_size=batch_size)
        plan.vectors[rows] = vecs
        bar.update(len(rows))
    bar.close()


def _stage_version(index_dir: Path, chunks: list[Chunk], vectors: npt.NDArray[np.float32],
                   bm25: Bm25Config) -> Path:
    """A temp directory in `index_dir` holding the version's vectors, chunks and BM25
    index (its manifest comes last, in `_publish`)."""
    retriever = build_bm25(chunks, bm25)
    tmp = Path(tempfile.mkdtemp(dir=index_dir, prefix=".tmp-"))
    np.save(tmp / VECTORS_FILE, vectors)
    (tmp / CHUNKS_FILE).write_bytes(msgspec.msgpack.encode(chunks))
    retriever.save(str(tmp / BM25_DIR), show_progress=False)
    return tmp


def _publish(index_dir: Path, tmp: Path, manifest: dict[str, Any], name: str) -> None:
    """The staged version, its manifest written and every file synced, renamed to `name`
    and made CURRENT; versions beyond the newest KEEP_VERSIONS collected."""
    (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))
    for f in tmp.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    os.replace(tmp, index_dir / name)
    _write_current(index_dir, name)
    _gc_versions(index_dir, KEEP_VERSIONS, name)
