"""Running the system: `up` (embedded stack + every worker), `worker`, `parser`, `migrate`."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer

from intentroute.cli.apps import app, settings, urls
from intentroute.cli.ask_cmd import ask_and_print
from intentroute.cli.data_cmds import ingest_into
from intentroute.settings import CliSettings
from intentroute.stack import ServerTls, StackInfo, embedded_stack, write_state
from intentroute.stack.auth import AuthSync, admin_kwargs, auth_files, server_pid, service_env
from intentroute.supervisor import Supervisor
from intentroute.workers import WORKERS, wait_for_consumers
from shared.natsconn import connect_kwargs, credential_kwargs, read_credential, tls_kwargs

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
    """Start the embedded stack if needed, migrate, and run every worker.

    The embedded nats-server admits credentials only: the admin (this process), one
    service user per worker type, and the agents in the database (a `demo` agent is
    created, its credential in <state>/creds/demo.json); agents added or revoked while
    it runs take effect within seconds."""
    counts = parse_replicas(replicas or [])
    cli = settings()
    state_dir = cli.state_dir
    embedded_nats = not cli.nats_url
    tls = (ServerTls(cli.nats_tls_server_cert, cli.nats_tls_server_key, cli.nats_tls_server_ca)
           if cli.nats_tls_server_cert else None)
    with embedded_stack(state_dir, nats_url=cli.nats_url, database_url=cli.database_url,
                        tls=tls) as (nats_url, db_url):
        from shared.store import migrate

        migrate(db_url)
        env = dict(os.environ, NATS_URL=nats_url, DATABASE_URL=db_url,
                   INDEX_DIR=str(cli.index_dir))
        nats_pid, sync = 0, None
        if embedded_nats:
            files = auth_files(state_dir)
            nats_pid = server_pid(files)
            admin = {**admin_kwargs(state_dir), **tls_kwargs(cli.common)}
            asyncio.run(_prepare_agents(state_dir, db_url, nats_pid))
            sync = AuthSync(state_dir, db_url, pid=nats_pid).start()
            for key in ("NATS_TOKEN", "NATS_CREDS"):
                env.pop(key, None)
        else:
            admin = connect_kwargs(cli.common)
        asyncio.run(_declare_streams(nats_url, admin, cli.common.response_ttl))
        kb = ingest_path or (DEMO_KB if not (cli.index_dir / "CURRENT").exists() else None)
        if kb is not None:
            ingest_into(kb, cli.index_dir)
        supervisor = Supervisor()
        parser_argv = _parser_argv(env)
        if parser_argv:
            supervisor.add("parser", parser_argv, env)
        for name, count in counts.items():
            worker_env = {**env, **service_env(state_dir, name)} if embedded_nats else env
            for _ in range(count):
                supervisor.add(name, [sys.executable, "-m", "intentroute.cli", "worker", name],
                               worker_env)
        write_state(state_dir, StackInfo(
            nats_url=nats_url, database_url=db_url, parser_url=env.get("AVAP_PARSER_URL", ""),
            pid=os.getpid(),
            nats_config=str(auth_files(state_dir).config) if embedded_nats else "",
            nats_pid=nats_pid,
        ))
        typer.echo(f"intentroute up: NATS {nats_url}  Postgres {_redacted(db_url)}  "
                   f"workers {', '.join(f'{n}x{c}' for n, c in counts.items())}", err=True)
        stop = {"flag": False}

        def _stop(*_: object) -> None:
            stop["flag"] = True

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        try:
            if demo:
                asyncio.run(_demo(nats_url, admin, _demo_kwargs(state_dir, cli) or admin))
                if exit_after_demo:
                    stop["flag"] = True
            # A worker that dies is restarted (with backoff); only a stop ends them all.
            while not stop["flag"]:
                supervisor.poll()
                time.sleep(0.1)
        finally:
            supervisor.stop()
            if sync is not None:
                sync.stop()
            (state_dir / "stack.json").unlink(missing_ok=True)


def _redacted(url: str) -> str:
    """A database URL for a log line: the password left out."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if not parts.password:
        return url
    return url.replace(f":{parts.password}@", ":***@", 1)


async def _prepare_agents(state_dir: Path, db_url: str, nats_pid: int) -> None:
    """The demo agent and its credential file, then every active agent into NATS."""
    from intentroute.stack.auth import DEMO_AGENT, apply_agents, ensure_agent_file
    from shared.store.agents import AgentStore

    store = await AgentStore.connect(db_url)
    try:
        await ensure_agent_file(store, state_dir, DEMO_AGENT)
        await apply_agents(store, state_dir, pid=nats_pid)
    finally:
        await store.close()


def _demo_kwargs(state_dir: Path, cli: CliSettings) -> dict[str, Any]:
    """The demo agent's connection when the embedded stack wrote its credential."""
    from intentroute.stack.auth import DEMO_AGENT

    path = auth_files(state_dir).credential(DEMO_AGENT)
    if cli.nats_url or not path.exists():
        return {}
    return credential_kwargs(read_credential(path), cli.common)


def _parser_argv(env: dict[str, str]) -> list[str]:
    """The reference AVAP parser service's command (it listens on a port chosen here,
    which the workers' env names), unless AVAP_PARSER_URL points elsewhere."""
    if env.get("AVAP_PARSER_URL") or env.get("AVAP_PARSER_TIMEOUT", "").strip() in ("0", "0.0"):
        return []
    from intentroute.stack import free_port

    port = free_port()
    env["AVAP_PARSER_URL"] = f"127.0.0.1:{port}"
    return [sys.executable, "-m", "intentroute.cli", "parser", "--port", str(port)]


async def _declare_streams(nats_url: str, admin: dict[str, Any], response_ttl: float) -> None:
    import nats

    from shared.bus import ensure_streams

    nc = await nats.connect(nats_url, **admin)
    try:
        await ensure_streams(nc.jetstream(), response_ttl)
    finally:
        await nc.drain()


async def _demo(nats_url: str, admin: dict[str, Any], caller: dict[str, Any]) -> None:
    """Wait for the workers (as the admin: consumer info), then ask as the demo agent."""
    import nats

    admin_nc = await nats.connect(nats_url, **admin)
    try:
        typer.echo("waiting for the workers...", err=True)
        await wait_for_consumers(admin_nc, list(WORKERS))
    finally:
        await admin_nc.drain()
    nc = await nats.connect(nats_url, **caller)
    session = f"demo-{uuid.uuid4().hex[:8]}"
    try:
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
    # The worker builds its settings from the environment: hand it the running stack's,
    # with its service user's credential when the environment carries none.
    if nats_url:
        os.environ["NATS_URL"] = nats_url
    if db_url:
        os.environ["DATABASE_URL"] = db_url
    cli = settings()
    if not cli.common.nats_authenticated and name in WORKERS:
        from shared.natsauth import service_user

        if auth_files(cli.state_dir).credential(service_user(name)).exists():
            os.environ.update(service_env(cli.state_dir, name))
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
