"""What an ingest did, for either backend."""

from __future__ import annotations

import msgspec

from services.retriever.indexing.documents import Skipped


class IngestReport(msgspec.Struct):
    docs: int
    chunks: int
    added: int  # chunk ids not in the previous version (embedded)
    updated: int  # same chunk id, new content (embedded)
    unchanged: int  # vector reused
    removed: int  # chunk ids gone with --replace (their documents disappeared or shrank)
    seconds: float
    chunks_per_s: float  # all chunks processed / wall time
    docs_per_s: float
    embedded: int = 0
    embed_seconds: float = 0.0
    embed_chunks_per_s: float = 0.0
    version: int = 0  # embedded index only
    changed: bool = True  # False: nothing differed, no new version was written
    dropped: int = 0  # without --replace: chunk ids gone from re-ingested documents
    # Files left out: not text, or of a kind not read (each with its reason).
    skipped: list[Skipped] = msgspec.field(default_factory=list)
