"""Retrieval backend port: the handler only needs `search` and `maybe_reload`."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from shared.contracts.pipeline import Passage
from shared.embeddings import Encoder

if TYPE_CHECKING:
    from services.retriever.index import EmbeddedIndex

log = logging.getLogger("intentroute.retriever")


class Retrieval(Protocol):
    async def search(self, query: str, k: int) -> list[Passage]: ...

    async def maybe_reload(self) -> bool: ...

    async def close(self) -> None: ...


class EmbeddedRetrieval:
    """The in-process index on disk (read-only here); follows re-ingests live."""

    def __init__(self, index_dir: Path, *, method: str, encoder: Encoder | None) -> None:
        self._dir = index_dir
        self._method = method
        self._encoder = encoder
        self._index: EmbeddedIndex | None = None

    def _open(self) -> EmbeddedIndex | None:
        from services.retriever.index import EmbeddedIndex

        if self._index is None:
            try:
                self._index = EmbeddedIndex.open(self._dir, self._encoder)
            except FileNotFoundError:
                log.warning("[retrieve] no index at %s yet: run `intentroute ingest PATH`",
                            self._dir)
                return None
        return self._index

    async def maybe_reload(self) -> bool:
        index = self._open()
        return bool(index and index.maybe_reload())

    async def search(self, query: str, k: int) -> list[Passage]:
        index = self._open()
        if index is None:
            return []
        if self._method == "bm25":
            return index.search(query, k=k, method="bm25").passages
        # Query embedding takes milliseconds of CPU: keep it off the event loop.
        result = await asyncio.to_thread(index.search, query, k, self._method)
        return result.passages

    async def close(self) -> None:
        self._index = None
