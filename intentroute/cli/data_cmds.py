"""Data in and out: `ingest`, `export-history`."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from intentroute.cli.apps import app, require_db, settings

if TYPE_CHECKING:
    from shared.encoders.embeddings import Encoder


@app.command()
def ingest(
    path: Annotated[Path | None, typer.Argument(
        help="Markdown/text file or folder, or corpus.jsonl")] = None,
    index_dir: Annotated[Path | None, typer.Option(help="Index directory")] = None,
    replace: Annotated[bool, typer.Option(
        "--replace", help="Make the index hold PATH's documents only: every other "
                          "source is removed")] = False,
    list_sources: Annotated[bool, typer.Option(
        "--list", help="Show what is indexed (source file, chunks, when it last changed, "
                       "where from) and change nothing")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="--list as JSON")] = False,
    yes: Annotated[bool, typer.Option(
        "--yes", help="Do not ask before a long ingest (only a terminal is asked)")
    ] = False,
) -> None:
    """Add documents to the embedded index, or to Elasticsearch when ES_URL is set.

    Each file read replaces its own earlier chunks and every other indexed source stays;
    reading the same files again embeds nothing. A file is known by its path relative
    to PATH (its name when PATH is a file), so a same-named file replaces it. --replace
    makes the index hold PATH's documents only. Prints a JSON summary on stderr: chunks
    added, updated, unchanged, and removed (0 unless --replace), and the files skipped
    with the reason (not text, or not .md, .txt, .jsonl).

    An ingest estimated to take over a minute says so first, and on a terminal asks
    (--yes does not); without a terminal it goes on. Exit 0 done, 3 done with files
    skipped, 1 nothing to index.
    """
    if list_sources:
        _list(index_dir or settings().index_dir, json_out)
        return
    if path is None:
        typer.echo("ingest needs PATH (a file or folder to add), or --list", err=True)
        raise typer.Exit(2)
    if not path.exists():
        typer.echo(f"no such file or folder: {path}", err=True)
        raise typer.Exit(2)
    from services.retriever.indexing.embedded_ingest import IngestDeclinedError

    try:
        done = ingest_into(path, index_dir or settings().index_dir, replace=replace,
                           confirm=partial(confirm_long_ingest, yes=yes))
    except ValueError as e:  # nothing to index under PATH
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    except IngestDeclinedError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    if done.get("skipped"):
        skipped = done["skipped"]
        typer.echo(f"ingest: {len(skipped)} {'file' if len(skipped) == 1 else 'files'} "
                   f"skipped (named in the summary); the others were ingested", err=True)
        raise typer.Exit(SKIPPED_FILES)


# `intentroute ingest`'s exit code when it ingested what it could read and skipped files.
SKIPPED_FILES = 3
# An ingest estimated to take longer than this (seconds) says so before it starts, and
# on a terminal asks first.
LONG_INGEST = 60.0
# Chunks embedded per second when no earlier full ingest measured it (the demo knowledge
# base on the 2-core development machine, fp32, encoder loaded).
DEFAULT_RATE = 25.0


def confirm_long_ingest(chunks: int, rate: float | None, *, yes: bool,
                        terminal: bool | None = None) -> bool:
    """Before embedding `chunks`: past LONG_INGEST (at `rate`, else DEFAULT_RATE), say how
    long it will take; ask on a terminal unless `yes`, else go on saying so."""
    import sys

    per_s = rate or DEFAULT_RATE
    seconds = chunks / per_s
    if seconds <= LONG_INGEST:
        return True
    took = f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
    typer.echo(f"ingest: {chunks:,} chunks to embed, about {took} at ~{per_s:.0f} chunks/s"
               f"{'' if rate else ' (an estimate: no earlier ingest measured it here)'}",
               err=True)
    if yes:
        return True
    if terminal if terminal is not None else sys.stdin.isatty():
        return typer.confirm("Go on?", default=True, err=True)
    typer.echo("ingest: not a terminal: going on without asking (--yes says so)", err=True)
    return True


def _list(index_dir: Path, json_out: bool) -> None:
    """The live index's sources, one line each (or one JSON object)."""
    import time

    from services.retriever.settings import RetrieverSettings

    if RetrieverSettings.from_env().es_url:
        typer.echo("ingest --list reads the embedded index; with ES_URL set, count "
                   "Elasticsearch's documents with its own API (_count)", err=True)
        raise typer.Exit(1)
    from services.retriever.indexing.embedded_ingest import list_sources

    sources = list_sources(index_dir)
    if json_out:
        typer.echo(json.dumps({"index_dir": str(index_dir), "sources": sources}))
        return
    if not sources:
        typer.echo(f"nothing indexed in {index_dir} (intentroute ingest PATH adds)", err=True)
        return
    width = max(len(k) for k in sources)
    for key, s in sources.items():
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.get("ingested_at") or 0))
        chunks = s.get("chunks", 0)
        unit = "chunk " if chunks == 1 else "chunks"
        typer.echo(f"{key:<{width}}  {chunks:>5} {unit}  {when}  {s.get('from')}")


def ingest_into(path: Path, index_dir: Path, *, replace: bool = False,
                echo: bool = True,
                confirm: Callable[[int, float | None], bool] | None = None,
                db_url: str | None = None) -> dict[str, Any]:
    """Ingest `path`; its JSON summary printed on stderr unless not `echo` (`up` logs it
    in one line), and returned. A progress bar only on a terminal. The answer cache
    forgets the answers built on what changed (`answer_cache` in the summary; `db_url`:
    the owner's, None: DATABASE_URL or the running stack's)."""
    from intentroute.cli.cache_cmds import invalidate_after_ingest
    from services.retriever.settings import RetrieverSettings
    from shared.encoders.embeddings import pin_threads
    from shared.encoders.fast import batch_fast_encoder

    retriever = RetrieverSettings.from_env()
    started = time.time()
    pin_threads(2)
    # Same vectors as sentence-transformers (cosine >= 0.9999), ~2x the chunks/s.
    encoder = batch_fast_encoder(retriever.embedding_model,
                                 precision=retriever.common.ingest_precision,
                                 onnx_cache_dir=retriever.common.onnx_cache_dir)
    if retriever.es_url:
        # The retriever reads Elasticsearch when ES_URL is set: fill that index instead.
        summary = asyncio.run(_ingest_es(path, retriever.es_url, retriever.es_index, encoder,
                                         replace))
    else:
        summary = _ingest_embedded(path, index_dir, encoder, replace, confirm)
    summary["answer_cache"] = invalidate_after_ingest(
        index_dir, elasticsearch=bool(retriever.es_url), changed=bool(summary.get("changed")),
        db_url=db_url, since=started)
    if echo:
        typer.echo(json.dumps(summary), err=True)
    return summary


def _ingest_embedded(path: Path, index_dir: Path, encoder: Encoder, replace: bool,
                     confirm: Callable[[int, float | None], bool] | None = None
                     ) -> dict[str, Any]:
    import sys

    import msgspec

    from services.retriever.indexing.embedded_ingest import ingest as run_ingest

    # Length-sorted batches; the encoder runs them in chunks of <= 8 (fastest here).
    report = run_ingest(path, index_dir, encoder, replace=replace,
                        progress=sys.stderr.isatty(), batch_size=16, confirm=confirm)
    return {"index_dir": str(index_dir), **msgspec.to_builtins(report)}


async def _ingest_es(path: Path, es_url: str, es_index: str, encoder: Encoder,
                     replace: bool) -> dict[str, Any]:
    import sys

    import msgspec
    from elasticsearch import AsyncElasticsearch

    from services.retriever.indexing.es_ingest import ingest_es

    client = AsyncElasticsearch(es_url)
    try:
        report = await ingest_es(client, path, encoder, index=es_index, replace=replace,
                                 progress=sys.stderr.isatty(), batch_size=16)
        return {"es_url": es_url, **msgspec.to_builtins(report)}
    finally:
        await client.close()


@app.command("export-history")
def export_history(
    out: Annotated[Path, typer.Option(help="JSONL file to write")] = Path("history.jsonl"),
    include_fallback: Annotated[
        bool, typer.Option(help="Also export guesses made without a confident layer")
    ] = False,
    min_confidence: Annotated[float, typer.Option(help="Skip decisions below this")] = 0.0,
    agent: Annotated[str | None, typer.Option(help="Only this agent's decisions")] = None,
) -> None:
    """classify_history -> labelled lines (topic, type, layer, confidence) for training."""
    from shared.store.export import export_history as run_export

    count = asyncio.run(run_export(require_db(), out, include_fallback=include_fallback,
                                   min_confidence=min_confidence, agent_id=agent))
    typer.echo(json.dumps({"written": count, "file": str(out)}))
