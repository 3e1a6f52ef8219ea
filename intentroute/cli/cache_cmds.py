"""The answer cache (issue 33): `cache stats|clear`, `eval cache PAIRS.jsonl` (its
matching decision on labelled pairs) and `bench cache` (a replay on a real stack)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from intentroute.cli.apps import app, bench_app, emit, eval_app, require_db

cache_app = typer.Typer(no_args_is_help=True,
                        help="The per-agent answer cache: what it holds, and emptying it.")
app.add_typer(cache_app, name="cache")

JsonFlag = Annotated[bool, typer.Option("--json", help="One JSON object on stdout")]
AgentOption = Annotated[str | None, typer.Option("--agent", help="Only this agent's entries")]


@cache_app.command("stats")
def cache_stats(agent: AgentOption = None, json_out: JsonFlag = False) -> None:
    """Per agent: entries held (and their bytes), hits served, model tokens saved, entries
    stored, evicted (cap, TTL, feedback) and invalidated by ingests, since the start."""
    from shared.cache.store import stats

    emit(asyncio.run(stats(require_db(), agent)), json_out)


@cache_app.command("clear")
def cache_clear(agent: AgentOption = None, json_out: JsonFlag = False) -> None:
    """Drop every entry (or one agent's); the classifiers forget them at once."""
    from shared.cache.store import clear

    emit({"cleared": asyncio.run(clear(require_db(), agent)), "agent": agent or "*"},
         json_out)


@eval_app.command("cache")
def eval_cache(
    pairs: Annotated[Path, typer.Argument(help="JSONL of {id, a, b, same, kind, type, lang}")],
    json_out: JsonFlag = False,
    predictions: Annotated[Path | None, typer.Option(
        help="Write one line per pair: id, hit, similarity, reason")] = None,
) -> None:
    """The answer cache's live matching decision on question pairs: hit_rate on the
    `same` pairs, false_hit_rate on the others, by kind, language and type, with the
    classifier's own vectors (CLASSIFIER_HEADS_DIR's current head)."""
    from services.classifier.adapters import build_classifier
    from services.classifier.offline.cache_eval import evaluate, load_pairs, write_predictions
    from services.classifier.settings import ClassifierSettings

    try:
        rows = load_pairs(pairs)
    except (OSError, ValueError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    classifier = build_classifier(ClassifierSettings.from_env())
    if classifier is None:
        typer.echo("CLASSIFIER_HEADS_DIR is empty (Layer 2 off): the cache has no vectors",
                   err=True)
        raise typer.Exit(2)
    encoder = classifier.first_encoder
    report, lines = evaluate(rows, encoder, layers=getattr(encoder, "layers", None))
    if predictions is not None:
        write_predictions(predictions, lines)
    emit(report, json_out)


@bench_app.command("cache")
def bench_cache(
    json_out: JsonFlag = False,
    agents: Annotated[int, typer.Option(help="Agents asking (each its own entries)")] = 3,
    rounds: Annotated[int, typer.Option(help="Times each question and its paraphrases "
                                             "are asked per agent")] = 2,
    batch_wait_ms: Annotated[float | None, typer.Option(
        help="The classifier's CLASSIFIER_MICRO_BATCH_WAIT_MS (default: as shipped, 2)")] = None,
) -> None:
    """A replay on a real stack (embedded NATS and Postgres, every worker, extractive
    answers): documentation and code questions with their paraphrases and hard
    negatives, asked by several agents, a document changed and ingested mid-run.
    hit_rate (paraphrases), false_hit_rate (hard negatives), cross_agent_hits,
    stale_hits_after_ingest, hit_p50_ms, miss_overhead_ms, tokens_saved."""
    from bench.cache import run

    emit(run(agents=agents, rounds=rounds, batch_wait_ms=batch_wait_ms), json_out)


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
    from shared.cache.store import invalidate_all, invalidate_sources
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
