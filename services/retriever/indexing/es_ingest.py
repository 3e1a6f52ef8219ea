"""Ingest into Elasticsearch: bulk upserts of new or changed chunks, deletes of chunks
gone from the files read (with `replace`: of every chunk not read), then one refresh
(applied in place, unlike the embedded index's versions). Like the embedded index, an
ingest adds: sources not read stay."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from services.retriever.es_bodies import DEFAULT_INDEX, build_mapping, call, chunk_source
from services.retriever.indexing.chunking import collect_chunks
from services.retriever.indexing.documents import Skipped, source_file
from services.retriever.indexing.report import IngestReport
from shared.encoders.embeddings import Encoder


async def _ensure_index(client: Any, index: str, dims: int) -> None:
    if await call(client.indices.exists(index=index)):
        return
    body = build_mapping(dims)
    await call(client.indices.create(index=index, settings=body["settings"],
                                     mappings=body["mappings"]))


async def _existing(client: Any, index: str) -> dict[str, tuple[str, str]]:
    """chunk id -> (content hash, source file) of what the index holds."""
    from elasticsearch import helpers

    out: dict[str, tuple[str, str]] = {}
    async for hit in helpers.async_scan(
        client, index=index,
        query={"query": {"match_all": {}}, "_source": ["content_hash", "source"]},
    ):
        src = hit["_source"]
        out[hit["_id"]] = (src.get("content_hash", ""), source_file(src.get("source", "")))
    return out


async def ingest_es(
    client: Any,
    path: Path,
    encoder: Encoder,
    *,
    index: str = DEFAULT_INDEX,
    replace: bool = False,
    progress: bool = True,
    batch_size: int = 64,
    max_tokens: int = 128,
    overlap_tokens: int = 16,
) -> IngestReport:
    """Idempotent by chunk_id + content_hash; creates the index on first use. The files
    read replace their own chunks, other sources stay (`replace`: only what was read
    stays); `removed` is 0 unless `replace`, `dropped` counts chunks a re-read file no
    longer has."""
    from elasticsearch import helpers
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    skipped: list[Skipped] = []
    docs, chunk_list = collect_chunks(Path(path), max_tokens, overlap_tokens, skipped)
    chunks = {c.chunk_id: c for c in chunk_list}
    await _ensure_index(client, index, encoder.dim)
    existing = await _existing(client, index)

    todo = [c for cid, c in chunks.items() if existing.get(cid, ("", ""))[0] != c.content_hash]
    added = sum(1 for c in todo if c.chunk_id not in existing)
    updated = len(todo) - added
    read_files = {source_file(c.source) for c in chunk_list}
    gone = [cid for cid, (_, src) in existing.items()
            if cid not in chunks and (replace or src in read_files)]
    todo.sort(key=lambda c: len(c.indexed_text))  # less padding per batch

    embed_secs = 0.0

    async def actions() -> AsyncIterator[dict[str, Any]]:
        nonlocal embed_secs
        bar = tqdm(total=len(todo), desc="embedding", unit="chunk", disable=not progress)
        for s in range(0, len(todo), batch_size):
            batch = todo[s : s + batch_size]
            t = time.perf_counter()
            vecs = await asyncio.to_thread(
                encoder.encode, [c.indexed_text for c in batch], batch_size)
            embed_secs += time.perf_counter() - t
            for c, v in zip(batch, vecs, strict=True):
                yield {"_op_type": "index", "_index": index, "_id": c.chunk_id,
                       "_source": chunk_source(c, v)}
            bar.update(len(batch))
        bar.close()
        for cid in gone:
            yield {"_op_type": "delete", "_index": index, "_id": cid}

    if todo or gone:
        await call(helpers.async_bulk(client, actions(), chunk_size=500))
        await call(client.indices.refresh(index=index))
    secs = time.perf_counter() - t0
    return IngestReport(
        docs=docs, chunks=len(chunks), added=added, updated=updated,
        unchanged=len(chunks) - len(todo), removed=len(gone) if replace else 0,
        dropped=0 if replace else len(gone), seconds=secs,
        chunks_per_s=len(chunks) / secs if secs else 0.0,
        docs_per_s=docs / secs if secs else 0.0, embedded=len(todo),
        embed_seconds=embed_secs,
        embed_chunks_per_s=len(todo) / embed_secs if embed_secs else 0.0,
        changed=bool(todo or gone), skipped=skipped,
    )
