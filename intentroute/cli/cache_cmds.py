"""The answer cache (issue 33): `cache stats|clear`, and the invalidation an ingest ends
with (`invalidate_after_ingest`, `reconcile_cache` at `up`). Its evaluation (`eval
cache`, tools/offline/commands.py) and benchmark (`bench cache`, tools/bench/commands.py)
are the tools' commands."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from intentroute.cli.apps import app, emit, require_db

cache_app = typer.Typer(no_args_is_help=True,
                        help="The per-agent answer cache: what it holds, and emptying it.")
app.add_typer(cache_app, name="cache")

JsonFlag = Annotated[bool, typer.Option("--json", help="One JSON object on stdout")]
AgentOption = Annotated[str | None, typer.Option("--agent", help="Only this agent's entries")]


@cache_app.command("stats")
def cache_stats(agent: AgentOption = None, json_out: JsonFlag = False) -> None:
    """Per agent: entries held (and their bytes), hits served, model tokens saved, entries
    stored, evicted (cap, TTL, feedback) and invalidated by ingests, since the start."""
    from shared.cache.entries import stats

    emit(asyncio.run(stats(require_db(), agent)), json_out)


@cache_app.command("clear")
def cache_clear(agent: AgentOption = None, json_out: JsonFlag = False) -> None:
    """Drop every entry (or one agent's); the classifiers forget them at once."""
    from shared.cache.entries import clear

    emit({"cleared": asyncio.run(clear(require_db(), agent)), "agent": agent or "*"},
         json_out)


def invalidate_after_ingest(index_dir: Path, *, elasticsearch: bool, changed: bool,
                            db_url: str | None = None,
                            since: float | None = None) -> dict[str, object]:
    """The answers an ingest made stale, deleted (as the owner): every entry built on a
    source whose chunks changed after its request was admitted, or on a source the
    index no longer holds (the embedded index's manifest says which and when: the
    sources it stamped at or after `since`, the start of this ingest; None: every
    source, as `up` reconciles); with Elasticsearch, whose sources are not listed,
    every entry when anything changed. `db_url`: the owner's (None: DATABASE_URL or the
    running stack's; "" or none reachable: nothing done, said so, and the next `up`
    reconciles)."""
    import asyncpg

    from intentroute.cli.apps import urls

    if db_url is None:
        db_url = urls()[1]
    if not db_url:
        return {"invalidated": None, "note": "no database: the next `up` reconciles"}
    if elasticsearch and not changed:
        return {"invalidated": 0}
    try:
        count = asyncio.run(_invalidate(db_url, index_dir, elasticsearch=elasticsearch,
                                        since=since))
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        return {"invalidated": None, "note": f"database unreachable ({exc}): the next `up` "
                                             "reconciles"}
    return {"invalidated": count}


def reconcile_cache(index_dir: Path, db_url: str) -> None:
    """At `up`: forget the answers built on what the embedded index changed while the
    stack was down (an ingest without a database to tell)."""
    import logging

    from services.retriever.settings import RetrieverSettings

    if (index_dir / "CURRENT").exists() and not RetrieverSettings.from_env().es_url:
        done = invalidate_after_ingest(index_dir, elasticsearch=False, changed=False,
                                       db_url=db_url)
        if done.get("note"):
            logging.getLogger("intentroute.up").warning("answer cache: %s", done["note"])


async def _invalidate(db_url: str, index_dir: Path, *, elasticsearch: bool,
                      since: float | None = None) -> int:
    import asyncpg

    from intentroute.cli.apps import OPTIONS
    from shared.cache.entries import invalidate_all, invalidate_sources
    from shared.store import asyncpg_dsn

    conn = await asyncpg.connect(asyncpg_dsn(db_url), timeout=OPTIONS.timeout)
    try:
        if await conn.fetchval("SELECT to_regclass('answer_cache') IS NULL"):
            return 0  # a database not migrated yet: nothing cached
        if elasticsearch:
            return await invalidate_all(conn)
        from services.retriever.indexing.embedded_ingest import list_sources

        sources = list_sources(index_dir)
        stamps = {name: float(s.get("ingested_at") or 0.0) for name, s in sources.items()}
        changed = {name: at for name, at in stamps.items() if since is None or at >= since}
        return await invalidate_sources(conn, changed, indexed=list(sources))
    finally:
        await conn.close()
