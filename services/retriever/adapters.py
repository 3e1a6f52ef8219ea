"""Retrieval backend port and the embedded adapter; the handler needs `search` and
`maybe_reload`, and a relevance judge for the optional LLM YES/NO check."""

from __future__ import annotations

import asyncio
import logging
import time
from functools import cache
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING, Protocol

from shared.contracts.pipeline import Passage
from shared.embeddings import Encoder

if TYPE_CHECKING:
    from services.retriever.index import EmbeddedBackend, SearchResult

log = logging.getLogger("intentroute.retriever")


class Retrieval(Protocol):
    async def search(self, query: str, k: int) -> SearchResult: ...

    async def maybe_reload(self) -> bool: ...

    async def close(self) -> None: ...


def empty_result(method: str) -> SearchResult:
    from services.retriever.index import SearchResult

    return SearchResult(passages=[], method=method)


class EmbeddedRetrieval:
    """The in-process index on disk, read-only here, through the index's own async
    backend. It waits for a first ingest, and checks for a newer one at most once per
    `reload_every` seconds instead of reading the pointer file on every request."""

    def __init__(self, index_dir: Path, *, method: str, encoder: Encoder | None,
                 reload_every: float = 1.0) -> None:
        self._dir = index_dir
        self._method = method
        self._encoder = encoder
        self._reload_every = reload_every
        self._checked = 0.0
        self._backend: EmbeddedBackend | None = None

    def _open(self) -> EmbeddedBackend | None:
        from services.retriever.index import EmbeddedBackend

        if self._backend is None:
            try:
                # BM25 alone is sub-millisecond: run it on the loop, not in a thread.
                self._backend = EmbeddedBackend.open(self._dir, self._encoder,
                                                     offload=self._method != "bm25")
            except FileNotFoundError:
                log.warning("[retrieve] no index at %s yet: run `intentroute ingest PATH`",
                            self._dir)
        return self._backend

    async def maybe_reload(self) -> bool:
        now = time.monotonic()
        if self._backend is not None and now - self._checked < self._reload_every:
            return False
        self._checked = now
        backend = self._open()
        return bool(backend and await backend.maybe_reload())

    async def search(self, query: str, k: int) -> SearchResult:
        backend = self._open()
        if backend is None:
            return empty_result(self._method)
        return await backend.search(query, k, self._method)

    async def close(self) -> None:
        self._backend = None


class RelevanceJudge(Protocol):
    """LLM YES/NO relevance check (ADR-0009 Decision 2), the optional alternative to
    the embedding signal. Returns None when no verdict could be had."""

    async def relevant(self, query: str, passages: list[Passage]) -> bool | None: ...


PROMPT = Path(__file__).resolve().parent / "prompts" / "relevance.txt"


@cache
def _template() -> Template:
    return Template(PROMPT.read_text(encoding="utf-8"))


def render_relevance_prompt(query: str, passages: list[Passage]) -> str:
    context = "\n\n".join(f"[{i}] {p.title}\n{p.text[:800]}" for i, p in enumerate(passages, 1))
    return _template().substitute(query=query, context=context or "(nothing retrieved)")


class OllamaRelevanceJudge:
    def __init__(self, host: str, model: str, *, timeout: float = 5.0) -> None:
        import ollama

        self._client = ollama.AsyncClient(host=host, timeout=timeout)
        self._model = model
        self._timeout = timeout

    async def relevant(self, query: str, passages: list[Passage]) -> bool | None:
        import httpx
        import ollama

        try:
            response = await asyncio.wait_for(self._client.generate(
                model=self._model, prompt=render_relevance_prompt(query, passages),
                options={"temperature": 0}, stream=False), self._timeout)
        except (TimeoutError, httpx.HTTPError, ollama.ResponseError, ConnectionError) as exc:
            log.warning("[retrieve] relevance judge unavailable: %r", exc)
            return None
        answer = (response.response or "").strip().upper()
        if answer.startswith("YES"):
            return True
        if answer.startswith("NO"):
            return False
        return None
