"""The answer cache in Postgres (migration 0019): the entries every replica indexes, the
functions the workers write through, and the operator's side (stats, clear, the
invalidation an ingest runs).

Workers never write the table: the generator and validator call `answer_cache_put`, the
classifier `answer_cache_hit` (both SECURITY DEFINER, bounded by the owner's rows).
`invalidate_sources` (an ingest, as the owner) takes the advisory lock every put shares,
so an answer built on a changed source is either refused by its put or deleted here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg
import msgspec

from shared.store import asyncpg_dsn

# The key of the advisory lock (migration 0019: LOCK).
LOCK = 3300033
# Seconds after a source's new version was published during which an answer admitted
# then still counts as built on the old one: a retriever checks for a new index version
# at most a second apart (`EmbeddedRetrieval.reload_every`) and loads it before it
# searches; the margin also covers the seconds an ingest takes to sync and publish the
# version after it stamps its sources (`ingested_at`), and clocks a little apart.
CHANGE_MARGIN_S = 10.0
# A source name that stands for every source (an index whose sources are not known:
# Elasticsearch; `invalidate_all`).
ALL_SOURCES = "*"


class CacheEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One stored answer as a replica holds it."""

    id: int
    agent_id: str
    request_id: str
    query: str
    query_type: str
    lang: str
    model_slot: str
    model: str
    answer: str
    avap_code: str = ""
    validation_status: str = ""
    tokens: int = 0
    # Epoch seconds.
    created_at: float
    expires_at: float


_COLUMNS = ("id, agent_id, request_id, query, query_type, lang, model_slot, model, answer, "
            "avap_code, validation_status, tokens, "
            "extract(epoch FROM created_at)::float8 AS created_at, "
            "extract(epoch FROM expires_at)::float8 AS expires_at")
_SQL_LIVE = f"SELECT {_COLUMNS} FROM answer_cache WHERE expires_at > now() ORDER BY id"
_SQL_BY_ID = f"SELECT {_COLUMNS} FROM answer_cache WHERE id = ANY($1::bigint[]) " \
             "AND expires_at > now()"
SQL_PUT = ("SELECT answer_cache_put($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::text[], "
           "$12::text[], $13, $14, $15)")
SQL_HIT = "SELECT answer_cache_hit($1, $2, $3)"


def _entry(row: Mapping[str, Any]) -> CacheEntry:
    return CacheEntry(**dict(row))


async def live_entries(db: asyncpg.Pool | asyncpg.Connection) -> list[CacheEntry]:
    """Every entry not expired (a replica's index at start and after a lost LISTEN)."""
    return [_entry(r) for r in await db.fetch(_SQL_LIVE)]


async def entries_by_id(db: asyncpg.Pool | asyncpg.Connection,
                        ids: Sequence[int]) -> list[CacheEntry]:
    return [_entry(r) for r in await db.fetch(_SQL_BY_ID, list(ids))]


# -- the operator's side (the owner's URL) -------------------------------------------

_SQL_STATS = """
WITH live AS (
    SELECT agent_id, count(*) AS entries, sum(octet_length(answer) + octet_length(query))
           AS bytes, min(created_at) AS oldest, sum(hits) AS entry_hits
    FROM answer_cache WHERE ($1::text IS NULL OR agent_id = $1) GROUP BY agent_id
)
SELECT COALESCE(l.agent_id, t.agent_id) AS agent_id, COALESCE(l.entries, 0) AS entries,
       COALESCE(l.bytes, 0) AS bytes, extract(epoch FROM now() - l.oldest)::float8 AS oldest_s,
       COALESCE(t.stored, 0) AS stored, COALESCE(t.hits, 0) AS hits,
       COALESCE(t.tokens_saved, 0) AS tokens_saved, COALESCE(t.evicted_cap, 0) AS evicted_cap,
       COALESCE(t.evicted_ttl, 0) AS evicted_ttl,
       COALESCE(t.evicted_feedback, 0) AS evicted_feedback,
       COALESCE(t.invalidated, 0) AS invalidated, COALESCE(t.cleared, 0) AS cleared
FROM live AS l FULL JOIN answer_cache_totals AS t ON t.agent_id = l.agent_id
WHERE $1::text IS NULL OR COALESCE(l.agent_id, t.agent_id) = $1
ORDER BY 1
"""


async def _connect(url: str) -> asyncpg.Connection:
    return await asyncpg.connect(asyncpg_dsn(url))


async def stats(url: str, agent: str | None = None) -> dict[str, Any]:
    """Per agent: what the cache holds and what it did (`intentroute cache stats`)."""
    conn = await _connect(url)
    try:
        rows = await conn.fetch(_SQL_STATS, agent)
    finally:
        await conn.close()
    agents = {}
    for row in rows:
        data = dict(row)
        name = data.pop("agent_id")
        if data["oldest_s"] is not None:
            data["oldest_s"] = round(data["oldest_s"], 1)
        agents[name] = data
    total = {key: sum(a[key] for a in agents.values())
             for key in ("entries", "hits", "tokens_saved", "stored")}
    return {"agents": agents, "total": total}


_SQL_CLEAR = """
WITH gone AS (
    DELETE FROM answer_cache WHERE $1::text IS NULL OR agent_id = $1 RETURNING agent_id
), counted AS (
    INSERT INTO answer_cache_totals AS t (agent_id, cleared)
    SELECT agent_id, count(*) FROM gone GROUP BY agent_id
    ON CONFLICT (agent_id) DO UPDATE SET cleared = t.cleared + EXCLUDED.cleared
)
SELECT count(*) FROM gone
"""


async def clear(url: str, agent: str | None = None) -> int:
    """Delete every entry (or one agent's); each replica forgets them as NOTIFY says."""
    conn = await _connect(url)
    try:
        return int(await conn.fetchval(_SQL_CLEAR, agent))
    finally:
        await conn.close()


# An entry is stale when one of its sources changed (or went) at or after its request
# was admitted: it may have been answered from the version before.
_SQL_MARK = """
INSERT INTO answer_cache_sources AS s (source, changed_at)
SELECT u.source, to_timestamp(u.at) FROM unnest($1::text[], $2::float8[]) AS u(source, at)
ON CONFLICT (source) DO UPDATE SET changed_at = GREATEST(s.changed_at, EXCLUDED.changed_at)
"""
_SQL_STALE = """
WITH stale AS (
    DELETE FROM answer_cache AS c
    WHERE EXISTS (SELECT 1 FROM answer_cache_sources AS s
                  WHERE (s.source = ANY(c.sources) OR s.source = '*')
                    AND s.changed_at >= c.accepted_at)
       OR ($1::text[] IS NOT NULL AND NOT (c.sources <@ $1::text[]))
    RETURNING c.agent_id
), counted AS (
    INSERT INTO answer_cache_totals AS t (agent_id, invalidated)
    SELECT agent_id, count(*) FROM stale GROUP BY agent_id
    ON CONFLICT (agent_id) DO UPDATE SET invalidated = t.invalidated + EXCLUDED.invalidated
)
SELECT count(*) FROM stale
"""


async def invalidate_sources(conn: asyncpg.Connection, changed: Mapping[str, float], *,
                             indexed: Sequence[str] | None = None) -> int:
    """After an ingest, as the owner: `changed` (source -> epoch seconds it changed,
    its new version published then) are recorded with the margin, and every entry
    built on a source that changed after its request was admitted, or (`indexed`: the
    sources the index holds now) on a source gone from the index, is deleted. Returns
    how many. Holds the advisory lock every `answer_cache_put` shares: no put of an
    answer built on the old version can slip between."""
    sources = list(changed)
    stamps = [changed[s] + CHANGE_MARGIN_S for s in sources]
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", LOCK)
        if sources:
            await conn.execute(_SQL_MARK, sources, stamps)
        return int(await conn.fetchval(_SQL_STALE, list(indexed) if indexed is not None
                                       else None))


async def invalidate_all(conn: asyncpg.Connection) -> int:
    """Every entry built before now (an index whose changed sources are not known)."""
    return await invalidate_sources(conn, {ALL_SOURCES: time.time()})
