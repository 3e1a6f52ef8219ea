"""Running the system: `up` (embedded stack + every worker), `worker`, `parser`, `migrate`."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import typer

from intentroute.cli.apps import app, settings, urls
from intentroute.cli.data_cmds import ingest_into
from intentroute.cli.demo import ask_samples
from intentroute.settings import CliSettings
from intentroute.stack import ServerTls, StackInfo, embedded_stack, free_port, write_state
from intentroute.stack.auth import AuthSync, admin_kwargs, auth_files, server_pids, service_env
from intentroute.stack.state import (
    DEFAULT_GATEWAY_HTTP_LISTEN,
    dashboard_token,
    gateway_http_listen,
)
from intentroute.supervisor import Supervisor
from intentroute.workers import WORKERS
from shared.auth.natsconn import connect_kwargs, tls_kwargs
from shared.common.settings import nats_servers

DEMO_KB = Path(__file__).resolve().parent.parent.parent / "kb" / "avap"


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
    nats_cluster: Annotated[int, typer.Option(
        "--nats-cluster", min=1,
        help="Embedded NATS nodes: 1 server, or a cluster of 3 (or more) with every "
             "stream replicated 3 times")] = 1,
    llm: Annotated[bool, typer.Option(
        "--llm", help="Answer with a local model (SmolLM2-135M on llama.cpp, CPU) instead "
                      "of the extractive answerer")] = False,
) -> None:
    """Start the embedded stack if needed, migrate, and run every worker.

    The embedded nats-server admits credentials only: the admin (this process), one
    service user per worker type, and the agents in the database (a `demo` agent is
    created, its credential in <state>/creds/demo.json); agents added or revoked while
    it runs take effect within seconds. With `--nats-cluster 3` three nats-servers
    run as one cluster on loopback (same users, routes authenticated) and every stream
    has 3 replicas: losing one node loses nothing."""
    counts = parse_replicas(replicas or [])
    cli = settings()
    state_dir = cli.state_dir
    embedded_nats = not cli.nats_url
    _check_cluster_size(nats_cluster, embedded_nats)
    with embedded_stack(state_dir, nats_url=cli.nats_url, database_url=cli.database_url,
                        tls=_server_tls(cli), nats_cluster=nats_cluster,
                        sync_interval=cli.nats_sync_interval) as (nats_url, db_url):
        from shared.store import migrate

        migrate(db_url)
        stream_replicas = cli.common.replicas(len(nats_servers(nats_url)))
        env, http = _stack_env(cli, nats_url, db_url, stream_replicas)
        admin, nats_pids, sync = _nats_access(cli, db_url, env, embedded_nats=embedded_nats)
        asyncio.run(_declare_streams(nats_url, admin, cli.common.response_ttl,
                                     stream_replicas))
        _ingest_knowledge_base(ingest_path, cli.index_dir)
        supervisor = _start_processes(cli, env, counts, llm=llm, embedded_nats=embedded_nats)
        info = StackInfo(
            nats_url=nats_url, database_url=db_url, parser_url=env.get("AVAP_PARSER_URL", ""),
            pid=os.getpid(),
            nats_config=_nats_config(state_dir, nats_cluster) if embedded_nats else "",
            nats_pid=nats_pids[0] if nats_pids else 0, nats_pids=nats_pids,
            gateway_http_url=http.url, dashboard_url=http.dashboard_url,
            dashboard_token_file=http.token_file,
        )
        write_state(state_dir, info)
        typer.echo(_banner(info, stream_replicas, counts), err=True)
        _run_until_stopped(supervisor, sync, state_dir,
                           demo=partial(ask_samples, cli, nats_url, admin) if demo else None,
                           exit_after_demo=exit_after_demo)


def _check_cluster_size(nodes: int, embedded_nats: bool) -> None:
    """--nats-cluster: 1 node, or 3 or more (a quorum survives one loss); embedded only."""
    if nodes == 2:
        raise typer.BadParameter("a cluster of 2 loses its quorum with either node: use 3",
                                 param_hint="--nats-cluster")
    if nodes > 1 and not embedded_nats:
        raise typer.BadParameter("NATS_URL names an external server; unset it for an "
                                 "embedded cluster", param_hint="--nats-cluster")


def _server_tls(cli: CliSettings) -> ServerTls | None:
    """The embedded nats-server's TLS files, when a server certificate is configured."""
    return (ServerTls(cli.nats_tls_server_cert, cli.nats_tls_server_key, cli.nats_tls_server_ca)
            if cli.nats_tls_server_cert else None)


class _HttpDoor(NamedTuple):
    """The gateway's HTTP listener as `up` announces it ("": off / none generated)."""

    url: str
    dashboard_url: str
    token_file: str


def _stack_env(cli: CliSettings, nats_url: str, db_url: str, stream_replicas: int
               ) -> tuple[dict[str, str], _HttpDoor]:
    """The environment every started process gets: the stack's URLs, the gateway's HTTP
    listen address and the operator dashboard's token. The dashboard is on, behind a token
    generated in the state dir, unless GATEWAY_DASHBOARD_TOKEN brings one."""
    env = dict(os.environ, NATS_URL=nats_url, DATABASE_URL=db_url,
               INDEX_DIR=str(cli.index_dir), NATS_STREAM_REPLICAS=str(stream_replicas))
    env["GATEWAY_HTTP_LISTEN"], http_url = gateway_http_listen(
        env.get("GATEWAY_HTTP_LISTEN", DEFAULT_GATEWAY_HTTP_LISTEN), free_port)
    token_file = ""
    if http_url and not env.get("GATEWAY_DASHBOARD_TOKEN"):
        path = dashboard_token(auth_files(cli.state_dir).creds_dir)
        env["GATEWAY_DASHBOARD_TOKEN"] = path.read_text(encoding="utf-8").strip()
        token_file = str(path)
    dashboard_url = f"{http_url}/dashboard" if http_url else ""
    return env, _HttpDoor(http_url, dashboard_url, token_file)


def _nats_access(cli: CliSettings, db_url: str, env: dict[str, str], *, embedded_nats: bool
                 ) -> tuple[dict[str, Any], list[int], AuthSync | None]:
    """This process's (admin) connection to NATS, the embedded servers' pids and the
    agents' sync. With the embedded servers, the agents are admitted (the demo agent
    created) and kept in sync, and `env` loses any NATS token/creds: each worker gets its
    service user's."""
    if not embedded_nats:
        return connect_kwargs(cli.common), [], None
    state_dir = cli.state_dir
    nats_pids = server_pids(auth_files(state_dir))
    admin = {**admin_kwargs(state_dir), **tls_kwargs(cli.common)}
    asyncio.run(_prepare_agents(state_dir, db_url, nats_pids))
    sync = AuthSync(state_dir, db_url, pids=nats_pids).start()
    for key in ("NATS_TOKEN", "NATS_CREDS"):
        env.pop(key, None)
    return admin, nats_pids, sync


def _ingest_knowledge_base(ingest_path: Path | None, index_dir: Path) -> None:
    """`--ingest`'s knowledge base; without it the demo one, if the index has none yet."""
    kb = ingest_path or (DEMO_KB if not (index_dir / "CURRENT").exists() else None)
    if kb is not None:
        ingest_into(kb, index_dir)


def _start_processes(cli: CliSettings, env: dict[str, str], counts: dict[str, int], *,
                     llm: bool, embedded_nats: bool) -> Supervisor:
    """The parser (unless one runs elsewhere), the local model with `--llm`, then each
    worker's replicas (with the embedded NATS, as its service user); with METRICS_PORT set,
    each worker on its own metrics port, listed in the scrape targets file."""
    state_dir = cli.state_dir
    supervisor = Supervisor()
    parser_argv = _parser_argv(env)
    if parser_argv:
        supervisor.add("parser", parser_argv, env)
    if llm:
        supervisor.add("llm", _llm_argv(env), env)
    plan = metrics_ports(counts, cli.common.metrics_port)
    ports = iter(plan)
    for name, count in counts.items():
        worker_env = {**env, **service_env(state_dir, name)} if embedded_nats else env
        for _ in range(count):
            port = next(ports, None)
            supervisor.add(name, [sys.executable, "-m", "intentroute.cli", "worker", name],
                           {**worker_env, "METRICS_PORT": str(port[1])} if port
                           else worker_env)
    if plan:
        write_targets(state_dir / METRICS_TARGETS, plan, cli.common.metrics_host)
    return supervisor


def _banner(info: StackInfo, stream_replicas: int, counts: dict[str, int]) -> str:
    """`up`'s one line on stderr: where everything is."""
    http_url, dashboard_url, token_file = (info.gateway_http_url, info.dashboard_url,
                                           info.dashboard_token_file)
    return (f"intentroute up: NATS {info.nats_url} (streams x{stream_replicas})  "
            f"Postgres {_redacted(info.database_url)}  "
            f"HTTP {http_url or 'off'}  dashboard {dashboard_url or 'off'}"
            f"{f' (token in {token_file})' if token_file else ''}  "
            f"workers {', '.join(f'{n}x{c}' for n, c in counts.items())}")


def _run_until_stopped(supervisor: Supervisor, sync: AuthSync | None, state_dir: Path, *,
                       demo: Callable[[], None] | None, exit_after_demo: bool) -> None:
    """Run the demo if asked, then keep the processes running until SIGTERM/SIGINT (or the
    demo's end with `exit_after_demo`); then stop them all and remove the state files."""
    stop = {"flag": False}

    def _stop(*_: object) -> None:
        stop["flag"] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        if demo is not None:
            demo()
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
        (state_dir / METRICS_TARGETS).unlink(missing_ok=True)


METRICS_TARGETS = "metrics_targets.json"


def metrics_ports(counts: dict[str, int], base: int) -> list[tuple[str, int]]:
    """(worker, port) per worker process, in start order: with METRICS_PORT set, each
    process of `up` serves its metrics on the next port from it (0: none)."""
    if not base:
        return []
    names = [name for name, count in counts.items() for _ in range(count)]
    return [(name, base + i) for i, name in enumerate(names)]


def write_targets(path: Path, ports: list[tuple[str, int]], host: str) -> None:
    """The scrape targets as a Prometheus `file_sd_configs` file (a restarted worker
    keeps its port, so the file stays true while `up` runs)."""
    import json

    scrape_host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
    groups = [{"targets": [f"{scrape_host}:{port}"], "labels": {"worker": name}}
              for name, port in ports]
    path.write_text(json.dumps(groups, indent=2) + "\n", encoding="utf-8")


def _redacted(url: str) -> str:
    """A database URL for a log line: the password left out."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if not parts.password:
        return url
    return url.replace(f":{parts.password}@", ":***@", 1)


def _nats_config(state_dir: Path, nodes: int) -> str:
    """The (first) embedded nats-server's config file."""
    files = auth_files(state_dir)
    if nodes > 1:
        return str(files.nats_dir / "node-1" / files.config.name)
    return str(files.config)


async def _prepare_agents(state_dir: Path, db_url: str, nats_pids: list[int]) -> None:
    """The demo agent and its credential file, then every active agent into NATS."""
    from intentroute.stack.auth import DEMO_AGENT, apply_agents, ensure_agent_file
    from shared.store.agents import AgentStore

    store = await AgentStore.connect(db_url)
    try:
        await ensure_agent_file(store, state_dir, DEMO_AGENT)
        await apply_agents(store, state_dir, pids=nats_pids)
    finally:
        await store.close()


def _parser_argv(env: dict[str, str]) -> list[str]:
    """The reference AVAP parser service's command (it listens on a port chosen here,
    which the workers' env names), unless AVAP_PARSER_URL points elsewhere."""
    if env.get("AVAP_PARSER_URL") or env.get("AVAP_PARSER_TIMEOUT", "").strip() in ("0", "0.0"):
        return []
    port = free_port()
    env["AVAP_PARSER_URL"] = f"127.0.0.1:{port}"
    return [sys.executable, "-m", "intentroute.cli", "parser", "--port", str(port)]


def _llm_argv(env: dict[str, str]) -> list[str]:
    """The local model server's command; the generators' env points at it (its API key
    travels in the env, never on a command line)."""
    from intentroute.stack.llm import LOCAL_MODEL, local_model_path, new_api_key, server_env

    local_model_path()  # a missing model is an error now, not a restart loop later
    port = free_port()
    env.update(server_env(port, new_api_key()))
    env.setdefault("OLLAMA_MODEL_NAME", LOCAL_MODEL)
    return [sys.executable, "-m", "intentroute.cli", "llm-server", "--port", str(port)]


async def _declare_streams(
    nats_url: str, admin: dict[str, Any], response_ttl: float, replicas: int
) -> None:
    import nats

    from shared.runtime.streams import ensure_streams

    nc = await nats.connect(nats_servers(nats_url), **admin)
    try:
        await ensure_streams(nc.jetstream(), response_ttl, replicas)
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
        from shared.auth.permissions import service_user

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


@app.command("llm-server")
def llm_server(
    port: Annotated[int, typer.Option()] = 8081,
    threads: Annotated[int, typer.Option(help="CPU threads for the model")] = 2,
) -> None:
    """Serve the local model (SmolLM2-135M, OpenAI-compatible chat API) on 127.0.0.1;
    every call needs OPENAI_API_KEY from the environment as its bearer token."""
    from intentroute.stack.llm import serve

    key = settings().openai_api_key
    if not key:
        raise typer.BadParameter("set OPENAI_API_KEY: the model server takes no "
                                 "anonymous calls")
    serve(port, api_key=key, threads=threads)
