"""The Protocols this service's handlers depend on; adapters implement them, tests pass fakes.

`Retrieval`: what the worker needs from a search backend, and what a search returns
(`SearchResult`). The embedded index (`embedded.EmbeddedRetrieval`) and Elasticsearch
(`es_backend.ElasticsearchRetrieval`) implement it, each configured with one method.
`RelevanceJudge`: the optional LLM relevance check (`adapters.ModelRelevanceJudge`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from shared.contracts.pipeline import Passage

METHODS = ("bm25", "dense", "hybrid")


def check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return method


@dataclass
class SearchResult:
    """Passages plus the signals the relevance check needs without re-embedding.

    `dense_scores[i]` / `bm25_scores[i]` belong to `passages[i]`; `dense_top1` is the
    cosine of the best dense hit over the whole index (NaN when no query vector was
    computed, e.g. method="bm25"). `version` is the embedded index version searched.
    `rrf_top1`: the first passage's RRF score (k=60, equal weights) over the hybrid's
    ranked lists, whatever its fusion (NaN: not a hybrid, or the backend does not say).
    """

    passages: list[Passage]
    method: str
    chunk_ids: list[str] = field(default_factory=list)
    query_vector: npt.NDArray[np.float32] | None = None
    dense_top1: float = math.nan
    dense_scores: list[float] = field(default_factory=list)
    bm25_top1: float = 0.0
    bm25_scores: list[float] = field(default_factory=list)
    passage_vectors: npt.NDArray[np.float32] | None = None
    version: int = 0
    rrf_top1: float = math.nan


@runtime_checkable
class Retrieval(Protocol):
    async def search(self, query: str, k: int) -> SearchResult:
        """The `k` best passages for `query` by the backend's configured method."""
        ...

    async def maybe_reload(self) -> bool:
        """Follow a newer ingest if there is one; True if the index changed."""
        ...

    async def close(self) -> None: ...


class RelevanceJudge(Protocol):
    """LLM YES/NO relevance check (ADR-0009 Decision 2), the optional alternative to
    the embedding signal. Returns None when no verdict could be had."""

    async def relevant(self, query: str, passages: list[Passage]) -> bool | None: ...
