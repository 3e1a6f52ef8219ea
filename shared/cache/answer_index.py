"""A replica's answer cache in memory: every live entry with its question's vector and
facts, bucketed by what must be equal before anything is compared (the owning agent,
query type, language, model slot and model). A lookup reads the buckets of the agents
whose entries the asker may see, takes the entries at or above the type's cosine
threshold best first, and serves the first whose facts agree and whose age is within
both agents' TTL (`shared.cache.match`). No I/O, no model: a matrix-vector product per
bucket (at most the per-agent cap of rows), then a few set comparisons.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from shared.cache.entries import CacheEntry
from shared.cache.facts import Facts, disagreement, facts
from shared.cache.match import THRESHOLDS
from shared.contracts.routing import QueryType

Vector = npt.NDArray[np.float32]


class Key(NamedTuple):
    owner: str
    query_type: str
    lang: str
    model_slot: str
    model: str


class Hit(NamedTuple):
    entry: CacheEntry
    similarity: float


class _Bucket:
    """The entries of one key, their vectors stacked for one product per lookup."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.rows: list[Vector] = []
        self._matrix: Vector | None = None

    def add(self, entry_id: int, vector: Vector) -> None:
        self.ids.append(entry_id)
        self.rows.append(vector)
        self._matrix = None

    def remove(self, entry_id: int) -> None:
        at = self.ids.index(entry_id)
        del self.ids[at], self.rows[at]
        self._matrix = None

    @property
    def matrix(self) -> Vector:
        if self._matrix is None:
            self._matrix = np.vstack(self.rows).astype(np.float32, copy=False)
        return self._matrix


def _unit(vector: npt.ArrayLike) -> Vector:
    v = np.asarray(vector, dtype=np.float32).ravel()
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


class AnswerIndex:
    """The entries a replica holds (module doc). Not thread-safe: one event loop."""

    def __init__(self, thresholds: dict[QueryType, float] | None = None) -> None:
        self.thresholds = dict(THRESHOLDS if thresholds is None else thresholds)
        self._entries: dict[int, tuple[CacheEntry, Facts, Key]] = {}
        self._buckets: dict[Key, _Bucket] = {}
        self._per_owner: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, entry_id: int) -> bool:
        return entry_id in self._entries

    def owners(self) -> set[str]:
        """The agents with entries here."""
        return set(self._per_owner)

    def holds(self, owner: str) -> bool:
        return owner in self._per_owner

    def add(self, entry: CacheEntry, vector: npt.ArrayLike) -> None:
        if entry.id in self._entries:
            return
        key = Key(entry.agent_id, entry.query_type, entry.lang, entry.model_slot, entry.model)
        self._entries[entry.id] = (entry, facts(entry.query), key)
        self._buckets.setdefault(key, _Bucket()).add(entry.id, _unit(vector))
        self._per_owner[entry.agent_id] = self._per_owner.get(entry.agent_id, 0) + 1

    def remove(self, entry_id: int) -> CacheEntry | None:
        held = self._entries.pop(entry_id, None)
        if held is None:
            return None
        entry, _, key = held
        bucket = self._buckets[key]
        bucket.remove(entry_id)
        if not bucket.ids:
            del self._buckets[key]
        left = self._per_owner[entry.agent_id] - 1
        if left:
            self._per_owner[entry.agent_id] = left
        else:
            del self._per_owner[entry.agent_id]
        return entry

    def clear(self) -> None:
        self._entries.clear()
        self._buckets.clear()
        self._per_owner.clear()

    def entries(self) -> list[CacheEntry]:
        return [entry for entry, _, _ in self._entries.values()]

    def lookup(
        self,
        scope: Iterable[str],
        *,
        query_type: QueryType,
        lang: str,
        model_slot: str,
        model: str,
        vector: npt.ArrayLike,
        question: Facts | Callable[[], Facts],
        now: float,
        max_age_s: Callable[[str], float],
    ) -> Hit | None:
        """The best entry of an agent in `scope` that may answer the question, or None.
        `question`: its facts, or how to get them (read only when an entry is similar
        enough: a miss usually never needs them). `max_age_s(owner)`: how old an entry
        of that agent may be (its TTL and the asker's, the shorter)."""
        threshold = self.thresholds.get(query_type)
        if threshold is None:
            return None
        q = _unit(vector)
        best: Hit | None = None
        asked: Facts | None = question if isinstance(question, Facts) else None
        for owner in scope:
            bucket = self._buckets.get(Key(owner, query_type.value, lang, model_slot, model))
            if bucket is None:
                continue
            sims = bucket.matrix @ q
            above = np.flatnonzero(sims >= threshold)
            if not above.size:
                continue
            oldest = now - max_age_s(owner)
            for at in above[np.argsort(-sims[above], kind="stable")]:
                similarity = float(sims[at])
                if best is not None and similarity <= best.similarity:
                    break
                entry, stored, _ = self._entries[bucket.ids[at]]
                if entry.expires_at <= now or entry.created_at < oldest:
                    continue
                if asked is None:
                    assert not isinstance(question, Facts)
                    asked = question()
                if disagreement(stored, asked):
                    continue
                best = Hit(entry, similarity)
                break
        return best
