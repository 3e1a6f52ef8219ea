"""The embedded index as the retrieval port: read-only, one method, async."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from services.retriever.fusion import FusionSettings
from services.retriever.index import EmbeddedIndex
from services.retriever.ports import SearchResult, check_method
from shared.encoders.embeddings import Encoder

log = logging.getLogger("intentroute.retriever")


class EmbeddedRetrieval:
    """The index on disk under `index_dir`, searched with `method`.

    It waits for a first ingest (an empty result until then), and checks for a newer
    one at most once per `reload_every` seconds instead of reading the pointer file on
    every request. A query that embeds costs ~5-15 ms of CPU, long enough to stall
    NATS heartbeats and acks under load, so it runs in a worker thread; BM25 alone
    takes well under a millisecond, less than the thread hand-off, and runs on the loop.
    """

    def __init__(self, index_dir: Path, *, method: str, encoder: Encoder | None,
                 settings: FusionSettings | None = None, reload_every: float = 1.0) -> None:
        self._dir = Path(index_dir)
        self._method = check_method(method)
        self._encoder = encoder
        self._settings = settings
        self._reload_every = reload_every
        self._checked = 0.0
        self._index: EmbeddedIndex | None = None

    def _open(self) -> EmbeddedIndex | None:
        if self._index is None:
            try:
                self._index = EmbeddedIndex.open(self._dir, self._encoder, self._settings)
            except FileNotFoundError:
                log.warning("[retrieve] no index at %s yet: run `intentroute ingest PATH`",
                            self._dir)
        return self._index

    async def maybe_reload(self) -> bool:
        now = time.monotonic()
        if self._index is not None and now - self._checked < self._reload_every:
            return False
        self._checked = now
        index = self._open()
        if index is None or not index.stale():  # the common case: one small read
            return False
        return await asyncio.to_thread(index.maybe_reload)

    async def search(self, query: str, k: int) -> SearchResult:
        index = self._open()
        if index is None:
            return SearchResult(passages=[], method=self._method)
        if self._method == "bm25":
            return index.search(query, k, "bm25")
        return await asyncio.to_thread(index.search, query, k, self._method)

    async def close(self) -> None:
        self._index = None
