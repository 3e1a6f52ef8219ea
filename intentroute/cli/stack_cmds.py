"""Running the system: `up` (embedded stack + every worker), `worker`, `parser`, `migrate`."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated

import typer

from intentroute.cli.apps import app, settings, urls
from intentroute.cli.ask_cmd import ask_and_print
from intentroute.cli.data_cmds import ingest_into
from intentroute.stack import StackInfo, embedded_stack, write_state
from intentroute.workers import WORKERS, wait_for_consumers

DEMO_KB = Path(__file__).resolve().parent.parent.parent / "kb" / "avap"

SAMPLE_QUESTIONS: list[dict[str, str]] = [
    {"query": "What does addParam do in AVAP and in which order does it search the request?"},
    {"query": "Write an AVAP endpoint that reads userId from the request and returns it"},
    {"query": "en menos palabras"},
    {
        "query": "You have a project usage percentage of 20%. Provide an insight in 2 sentences.",
        "extra_context": "project=demo usage_percentage=20 plan=starter monthly_calls=2000 "
        "calls_used=400",
    },
]


def parse_replicas(spec: list[str]) -> dict[str, int]:
    counts = {name: 1 for name in WORKERS}
    for item in spec:
        for part in item.split(","):
            if not part.strip():
                continue
            name, _, value = part.partition("=")
            if name.strip() not in counts:
                raise typer.BadParameter(f"unknown worker {name!r}; known: {', '.join(WORKERS)}")
            counts[name.strip()] = int(value)
    return counts


@app.command()
def up(
    replicas: Annotated[
        list[str] | None,
        typer.Option(help="Replicas per worker, e.g. --replicas classifier=2,generator-main=2"),
    ] = None,
    ingest_path: Annotated[
        Path | None, typer.Option("--ingest", help="Knowledge base to ingest before starting")
    ] = None,
    demo: Annotated[bool, typer.Option(help="Ask one sample question per type")] = False,
    exit_after_demo: Annotated[bool, typer.Option(help="Stop after the demo")] = False,
) -> None:
    """Start the embedded stack if needed, migrate, and run every worker."""
    counts = parse_replicas(replicas or [])
    cli = settings()
    state_dir = cli.state_dir
    with embedded_stack(state_dir, nats_url=cli.nats_url, database_url=cli.database_url) as (
        nats_url, db_url
    ):
        from shared.store import migrate

        migrate(db_url)
        asyncio.run(_declare_streams(nats_url, cli.common.response_ttl))
        env = dict(os.environ, NATS_URL=nats_url, DATABASE_URL=db_url,
                   INDEX_DIR=str(cli.index_dir))
        kb = ingest_path or (DEMO_KB if not (cli.index_dir / "CURRENT").exists() else None)
        if kb is not None:
            ingest_into(kb, cli.index_dir)
        procs: list[subprocess.Popen[bytes]] = list(_start_parser(env))
        for name, count in counts.items():
            for _ in range(count):
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "intentroute.cli", "worker", name], env=env
                ))
        write_state(state_dir, StackInfo(nats_url=nats_url, database_url=db_url,
                                         parser_url=env.get("AVAP_PARSER_URL", ""),
                                         pid=os.getpid()))
        typer.echo(f"intentroute up: NATS {nats_url}  Postgres {db_url}  "
                   f"workers {', '.join(f'{n}x{c}' for n, c in counts.items())}", err=True)
        stop = {"flag": False}

        def _stop(*_: object) -> None:
            stop["flag"] = True

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        try:
            if demo:
                asyncio.run(_demo(nats_url))
                if exit_after_demo:
                    stop["flag"] = True
            while not stop["flag"]:
                dead = [p for p in procs if p.poll() is not None]
                if dead:
                    typer.echo(f"a worker exited with {dead[0].returncode}; stopping", err=True)
                    raise typer.Exit(1)
                time.sleep(0.5)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
            (state_dir / "stack.json").unlink(missing_ok=True)


def _start_parser(env: dict[str, str]) -> list[subprocess.Popen[bytes]]:
    """The reference AVAP parser service, unless AVAP_PARSER_URL points elsewhere."""
    if env.get("AVAP_PARSER_URL") or env.get("AVAP_PARSER_TIMEOUT", "").strip() in ("0", "0.0"):
        return []
    from intentroute.stack import free_port

    port = free_port()
    env["AVAP_PARSER_URL"] = f"127.0.0.1:{port}"
    return [subprocess.Popen(
        [sys.executable, "-m", "intentroute.cli", "parser", "--port", str(port)], env=env
    )]


async def _declare_streams(nats_url: str, response_ttl: float) -> None:
    import nats

    from shared.bus import ensure_streams

    nc = await nats.connect(nats_url)
    try:
        await ensure_streams(nc.jetstream(), response_ttl)
    finally:
        await nc.drain()


async def _demo(nats_url: str) -> None:
    import nats

    nc = await nats.connect(nats_url)
    session = f"demo-{uuid.uuid4().hex[:8]}"
    try:
        typer.echo("waiting for the workers...", err=True)
        await wait_for_consumers(nc, list(WORKERS))
        for sample in SAMPLE_QUESTIONS:
            typer.secho(f"\n> {sample['query']}", bold=True)
            await ask_and_print(nc, agent="demo", session=session, json_lines=False,
                                extra_context=sample.get("extra_context", ""),
                                query=sample["query"])
    finally:
        await nc.drain()


@app.command()
def worker(name: Annotated[str, typer.Argument(help=f"One of: {', '.join(WORKERS)}")]) -> None:
    """Run one worker (for ops: scale a stage by running more of these)."""
    nats_url, db_url = urls()
    # The worker builds its settings from the environment: hand it the running stack's.
    if nats_url:
        os.environ["NATS_URL"] = nats_url
    if db_url:
        os.environ["DATABASE_URL"] = db_url
    import uvloop

    from intentroute.workers import create_worker

    worker_app = create_worker(name)
    uvloop.run(worker_app.run())


@app.command()
def migrate() -> None:
    """Apply the Alembic migrations to DATABASE_URL."""
    from intentroute.cli.apps import require_db
    from shared.store import migrate as run_migrate

    run_migrate(require_db())


@app.command()
def parser(
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 50051,
    strict: Annotated[bool, typer.Option(help="Strict (spec) mode by default")] = False,
) -> None:
    """Run the AVAP parser gRPC service."""
    from services.parser.server import run

    asyncio.run(run(host, port, default_strict=strict))
