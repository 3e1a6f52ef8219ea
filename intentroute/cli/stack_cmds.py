"""`intentroute up`: the embedded stack and every worker, supervised, in named steps (the
one-process commands `worker`, `parser`, `migrate`, `db-init`, `llm-server` are in
`serve_cmds`)."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import typer

from intentroute.cli.apps import app, urls
from intentroute.cli.cache_cmds import reconcile_cache
from intentroute.cli.data_cmds import ingest_into
from intentroute.cli.demo import ask_samples
from intentroute.cli.ready import announce_when_ready, login_links_dir
from intentroute.cli.stack_home import writable_home
from intentroute.drain import (
    DEFAULT_DRAIN_TIMEOUT,
    StopSignals,
    WaitIdle,
    drain,
    interrupt_on_stop_signals,
    nats_wait_idle,
)
from intentroute.settings import CliSettings
from intentroute.stack import (
    NatsServer,
    PostgresServer,
    ServerTls,
    StackInfo,
    embedded_stack,
    free_port,
    write_state,
)
from intentroute.stack.keeper import ServerKeeper, stack_keeper, update_pids
from intentroute.stack.leftovers import wait_for_leftovers
from intentroute.stack.lock import StackLockedError, StateLock
from intentroute.stack.nats_users import (
    AuthSync,
    admin_kwargs,
    auth_files,
    server_pids,
    service_env,
)
from intentroute.stack.pgroles import (
    DatabaseUrls,
    StageSecrets,
    database_urls,
    init_database,
    learns,
    role_passwords,
)
from intentroute.stack.scrape import METRICS_TARGETS, metrics_ports, write_targets
from intentroute.stack.sidecars import llm_argv, parser_argv, runs_parser
from intentroute.stack.state import (
    DEFAULT_GATEWAY_GRPC_LISTEN,
    DEFAULT_GATEWAY_HTTP_LISTEN,
    dashboard_token,
    gateway_grpc_listen,
    gateway_http_listen,
)
from intentroute.stack.tcp_ports import PortPlan, PortTakenError, StackPorts, Wanted, plan_ports
from intentroute.supervisor import Supervisor
from intentroute.workers import ALL_WORKERS, LEARNER, WORKERS
from shared.auth.natsconn import connect_kwargs, tls_kwargs
from shared.common.limits import StreamLimits
from shared.common.otel import PROMETHEUS_PORT
from shared.common.settings import CommonSettings, is_set, nats_servers
from shared.runtime.logs import configure_logging

DEMO_KB = Path(__file__).resolve().parent.parent.parent / "kb" / "avap"


def parse_replicas(spec: list[str], *, learning: bool = False) -> dict[str, int]:
    """Replicas per worker type: one of each of WORKERS, and one learner when the
    learning job is on (`learning`: LEARN_INTERVAL > 0), unless `spec` says otherwise
    (`doors=2`, `learner=1`, ...)."""
    counts = {name: 1 for name in WORKERS}
    counts[LEARNER] = 1 if learning else 0
    for item in spec:
        for part in item.split(","):
            if not part.strip():
                continue
            name, _, value = part.partition("=")
            if name.strip() not in counts:
                raise typer.BadParameter(
                    f"unknown worker {name!r}; known: {', '.join(ALL_WORKERS)}")
            counts[name.strip()] = int(value)
    return {name: count for name, count in counts.items() if count or name != LEARNER}


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
    nats_port: Annotated[int | None, typer.Option(
        "--nats-port", min=0, help="The embedded NATS's client port (a cluster's node 1; "
                                   "the others the next ones); default NATS_PORT, else the "
                                   "last up's, else a free one; 0: a free one")] = None,
    postgres_port: Annotated[int | None, typer.Option(
        "--postgres-port", min=0, help="The embedded Postgres's port; default "
                                       "POSTGRES_PORT, else the last up's, else a free one; "
                                       "0: a free one")] = None,
    drain_timeout: Annotated[float | None, typer.Option(
        "--drain-timeout", min=0,
        help="On Ctrl-C / SIGTERM: seconds the workers get to finish the requests in flight "
             "before they are stopped (default UP_DRAIN_TIMEOUT, else 30)")] = None,
    grpc: Annotated[bool, typer.Option(
        "--grpc", help="Serve the doors' gRPC face (AskAgent, Feedback, health, "
                       "reflection) on loopback, its address in stack.json "
                       "(gateway_grpc_address); GATEWAY_GRPC_LISTEN picks another")] = False,
) -> None:
    """Start the embedded stack if needed, migrate, and run every worker (the doors
    included; the learner when LEARN_INTERVAL is set).

    The embedded nats-server admits credentials only: the admin (this process), one
    service user per worker type, and the agents in the database (a `demo` agent is
    created, its credential in <state>/creds/demo.json); agents added or revoked while
    it runs take effect within seconds. With `--nats-cluster 3` three nats-servers
    run as one cluster on loopback (same users, routes authenticated) and every stream
    has 3 replicas: losing one node loses nothing. A server that dies is started again
    on the same port; the next `up` in the same state dir takes the same ports."""
    cli = CliSettings.from_env(starting=True)  # the state folder absolute, here or the variable's
    counts = parse_replicas(replicas or [], learning=learns(os.environ.get("LEARN_INTERVAL", "")))
    configure_logging(level=cli.common.log_level, fmt=cli.common.log_format, worker="up")
    _check_fleet(cli)
    state_dir = cli.state_dir
    writable_home(cli)
    embedded_nats = not cli.nats_url
    _check_cluster_size(nats_cluster, embedded_nats)
    lock = _own_state_dir(state_dir)  # before anything reads or writes the state dir
    _await_leftovers(state_dir)
    ports = _plan_ports(cli, nats_cluster if embedded_nats else 0, nats_port, postgres_port,
                        llm, grpc, metrics=_metrics_wanted(cli, counts))
    servers: list[tuple[str, NatsServer | PostgresServer]] = []
    # An external DATABASE_URL with its DATABASE_PASSWORD_FILE applied.
    external_db = urls(cli)[1] if cli.database_url else ""
    with embedded_stack(state_dir, nats_url=cli.nats_url, database_url=external_db,
                        tls=_server_tls(cli), nats_cluster=nats_cluster,
                        sync_interval=cli.nats_sync_interval, ports=ports.ports,
                        servers=servers) as (nats_url, server_url):
        from shared.store import migrate
        from shared.store.owner_settings import OwnerSettings

        db = _database_roles(cli, server_url)
        db_url = db.owner
        migrate(db_url, OwnerSettings.of_common(cli.common))
        stream_replicas = cli.common.replicas(len(nats_servers(nats_url)))
        env, http = _stack_env(cli, nats_url, stream_replicas, ports.ports.gateway_http)
        grpc_address = _gateway_grpc(env, grpc, ports.ports.gateway_grpc)
        admin, nats_pids, sync = _nats_access(cli, db_url, env, embedded_nats=embedded_nats)
        asyncio.run(_declare_streams(nats_url, admin, cli.common.response_ttl,
                                     stream_replicas, cli.common.streams))
        _ingest_knowledge_base(ingest_path, cli.index_dir, db_url)
        supervisor = _start_processes(cli, env, counts, llm=llm, embedded_nats=embedded_nats,
                                      secrets=StageSecrets(db, http.token),
                                      stack_ports=ports.ports)
        info = StackInfo(
            nats_url=nats_url, database_url=db_url, parser_url=env.get("AVAP_PARSER_URL", ""),
            pid=os.getpid(),
            nats_config=_nats_config(state_dir, nats_cluster) if embedded_nats else "",
            nats_pid=nats_pids[0] if nats_pids else 0, nats_pids=nats_pids,
            gateway_http_url=http.url, dashboard_url=http.dashboard_url,
            dashboard_token_file=http.token_file, gateway_grpc_address=grpc_address,
            metrics_port=ports.ports.metrics,
            metrics_targets=str(state_dir / METRICS_TARGETS) if ports.ports.metrics else "",
        )
        update_pids(info, servers)
        write_state(state_dir, info)
        ports.save()
        typer.echo(f"{_banner(info, stream_replicas, counts)}  {ports.summary()}", err=True)
        _run_until_stopped(supervisor, sync, state_dir,
                           keeper=stack_keeper(servers, state_dir, info, sync),
                           demo=partial(ask_samples, cli, nats_url, admin) if demo else None,
                           exit_after_demo=exit_after_demo,
                           ready=partial(announce_when_ready, info, state_dir, nats_url, admin),
                           wait_idle=nats_wait_idle(nats_servers(nats_url), admin),
                           drain_timeout=(cli.up_drain_timeout if drain_timeout is None
                                          else drain_timeout))
    lock.release()


def _own_state_dir(state_dir: Path) -> StateLock:
    """`up`'s hold on its state directory, for its lifetime: a second `up` there exits 1
    in one line naming the first's pid, having touched none of its files. Until the
    drain's handlers take over, SIGTERM and SIGHUP interrupt the start-up as Ctrl-C does
    (the servers already started are stopped on the way out)."""
    try:
        lock = StateLock(state_dir).acquire()
    except StackLockedError as exc:
        typer.echo(f"intentroute up: {exc}", err=True)
        raise typer.Exit(1) from None
    interrupt_on_stop_signals()
    return lock


def _await_leftovers(state_dir: Path) -> None:
    """An `up` that died here without stopping its stack (kill -9) left its stack.json:
    wait until its servers, signalled by the kernel as it died, have stopped and the
    ports clients hold are free again (intentroute.stack.leftovers). One line when it
    waited; a port still taken afterwards is refused by `_plan_ports`."""
    left = wait_for_leftovers(state_dir)
    if left.held:
        still = f"; still running: {', '.join(left.holding)}" if left.holding else ""
        typer.echo(f"intentroute up: the last up here (pid {left.dead_pid}) ended without "
                   f"stopping its stack; waited {left.waited:.1f}s for its processes to "
                   f"stop{still}", err=True)


def _plan_ports(cli: CliSettings, nats_nodes: int, nats_port: int | None,
                postgres_port: int | None, llm: bool, grpc: bool = False, *,
                metrics: tuple[int, int | None] = (0, None)) -> PortPlan:
    """This `up`'s ports, chosen before anything starts (docs/guides/operations/
    reliability.md, stable addresses): a flag wins over its variable, which wins over
    the last `up`'s port; a taken port that clients hold ends `up` in one line."""
    listen = os.environ.get("GATEWAY_HTTP_LISTEN", DEFAULT_GATEWAY_HTTP_LISTEN).strip()
    grpc_listen = os.environ.get("GATEWAY_GRPC_LISTEN", "").strip()
    wanted = Wanted(
        nats_nodes=nats_nodes, nats_port=cli.nats_port if nats_port is None else nats_port,
        postgres=not cli.database_url,
        postgres_port=cli.postgres_port if postgres_port is None else postgres_port,
        gateway_http=listen.endswith(":0"), parser=runs_parser(os.environ), llm=llm,
        gateway_grpc=(grpc and not grpc_listen) or grpc_listen.endswith(":0"),
        metrics=metrics[0], metrics_port=metrics[1])
    try:
        return plan_ports(cli.state_dir, wanted)
    except PortTakenError as exc:
        typer.echo(f"intentroute up: {exc}", err=True)
        raise typer.Exit(2) from None


def _metrics_wanted(cli: CliSettings, counts: dict[str, int]) -> tuple[int, int | None]:
    """(worker processes serving Prometheus metrics, METRICS_PORT when set): on by
    default under `up`; off with METRICS_PORT=0, OTEL_SDK_DISABLED=true or an
    OTEL_METRICS_EXPORTER that leaves `prometheus` out."""
    common = cli.common
    explicit = common.metrics_port if is_set(CommonSettings, "metrics_port") else None
    if explicit == 0 or "prometheus" not in common.otel.metrics_exporters(
            explicit or PROMETHEUS_PORT):
        return 0, None
    return sum(counts.values()), explicit


def _check_fleet(cli: CliSettings) -> None:
    """Every model server the settings declare, checked before anything starts: a
    malformed URL (no scheme, no host, an OpenAI-compatible one without /v1), a key not
    given by reference, a slot naming a model no backend serves: one line, exit 2
    (FleetError is a setting's error). Whether each answers is the workers' start-up
    probe's to say, at once, in one warning line."""
    from shared.llm.select import open_fleet

    open_fleet(cli.common)


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
    """The doors' HTTP listener as `up` announces it ("": off / none generated), and
    the dashboard's token (the doors' environment alone gets it)."""

    url: str
    dashboard_url: str
    token_file: str
    token: str = ""


def _gateway_grpc(env: dict[str, str], wanted: bool, port: int = 0) -> str:
    """The doors' gRPC listener under `up`: `--grpc` serves it at
    DEFAULT_GATEWAY_GRPC_LISTEN (loopback, a port kept for the next `up`) unless
    GATEWAY_GRPC_LISTEN says where (which alone turns it on too). Sets the replicas'
    GATEWAY_GRPC_LISTEN (port 0 pinned: they share the port) and returns the address
    clients dial ("": off)."""
    listen = env.get("GATEWAY_GRPC_LISTEN", "") or (DEFAULT_GATEWAY_GRPC_LISTEN
                                                     if wanted else "")
    env["GATEWAY_GRPC_LISTEN"], address = gateway_grpc_listen(
        listen, lambda: port or free_port())
    return address


def _database_roles(cli: CliSettings, server_url: str) -> DatabaseUrls:
    """The owner's and each worker's Postgres URL. On the embedded Postgres the
    superuser creates (or brings up to date) the roles and hands the database to the
    owner, and is not used again; a DATABASE_URL of the environment is every process's,
    as given (`intentroute db-init` makes the roles there: docs/guides/security.md)."""
    if cli.database_url:
        return DatabaseUrls(server_url, {})
    passwords = role_passwords(cli.state_dir / "postgres")
    asyncio.run(init_database(server_url, PostgresServer.DB, passwords))
    return database_urls(server_url, passwords)


def _stack_env(cli: CliSettings, nats_url: str, stream_replicas: int, http_port: int = 0
               ) -> tuple[dict[str, str], _HttpDoor]:
    """The environment every started process gets: the stack's NATS URL and the doors'
    HTTP listen address. No secret: the database URLs and the dashboard's token are each
    worker's own (StageSecrets). The dashboard is on, behind a token generated in the
    state dir, unless GATEWAY_DASHBOARD_TOKEN (or its _FILE) brings one."""
    env = dict(os.environ, NATS_URL=nats_url, INDEX_DIR=str(cli.index_dir),
               NATS_STREAM_REPLICAS=str(stream_replicas), INTENTROUTE_HOME=str(cli.state_dir))
    # Six workers' progress bars would interleave into one log, even on a terminal.
    env.setdefault("TQDM_DISABLE", "1")
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for secret in ("DATABASE_URL", "DATABASE_PASSWORD_FILE", "GATEWAY_DASHBOARD_TOKEN",
                   "GATEWAY_DASHBOARD_TOKEN_FILE", "LEARN_DATABASE_URL"):
        env.pop(secret, None)
    env["GATEWAY_HTTP_LISTEN"], http_url = gateway_http_listen(
        env.get("GATEWAY_HTTP_LISTEN", DEFAULT_GATEWAY_HTTP_LISTEN),
        lambda: http_port or free_port())
    from services.doors.dashboard.settings import DashboardSettings

    # GATEWAY_DASHBOARD_TOKEN, or the file GATEWAY_DASHBOARD_TOKEN_FILE names.
    token_file, token = "", DashboardSettings.from_env().token
    if http_url and not token:
        path = dashboard_token(auth_files(cli.state_dir).creds_dir)
        token = path.read_text(encoding="utf-8").strip()
        token_file = str(path)
    dashboard_url = f"{http_url}/dashboard" if http_url else ""
    if token and http_url:  # one-time login links (the ready screen's)
        env.setdefault("GATEWAY_DASHBOARD_LOGIN_LINKS", str(login_links_dir(cli.state_dir)))
        login_links_dir(cli.state_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
    return env, _HttpDoor(http_url, dashboard_url, token_file, token if http_url else "")


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
    asyncio.run(_prepare_agents(state_dir, db_url, nats_pids, url=env["NATS_URL"],
                                ca=cli.common.nats_tls_ca))
    sync = AuthSync(state_dir, db_url, pids=nats_pids).start()
    for key in ("NATS_TOKEN", "NATS_CREDS"):
        env.pop(key, None)
    return admin, nats_pids, sync


def _ingest_knowledge_base(ingest_path: Path | None, index_dir: Path, db_url: str) -> None:
    """`--ingest`'s knowledge base; without it the demo one, if the index has none yet.
    What it did is one line of `up`'s log (`intentroute ingest` prints the JSON). Either
    way the answer cache forgets what the index changed meanwhile (an ingest run while
    no database was reachable)."""
    kb = ingest_path or (DEMO_KB if not (index_dir / "CURRENT").exists() else None)
    if kb is None:
        reconcile_cache(index_dir, db_url)
        return
    done = ingest_into(kb, index_dir, echo=False, db_url=db_url)
    logging.getLogger("intentroute.up").info(
        "ingested %s: %d documents, %d chunks (added %d, updated %d, unchanged %d, "
        "removed %d) in %.1f s", kb, done.get("docs", 0), done.get("chunks", 0),
        done.get("added", 0), done.get("updated", 0), done.get("unchanged", 0),
        done.get("removed", 0), done.get("seconds", 0.0))
    if done.get("skipped"):
        logging.getLogger("intentroute.up").warning("skipped %s", "; ".join(
            f"{s['file']}: {s['reason']}" for s in done["skipped"]))


def _start_processes(cli: CliSettings, env: dict[str, str], counts: dict[str, int], *,
                     llm: bool, embedded_nats: bool, secrets: StageSecrets,
                     stack_ports: StackPorts | None = None) -> Supervisor:
    """The parser (unless one runs elsewhere), the local model with `--llm`, then each
    worker's replicas (with the embedded NATS, as its service user; its own database role
    and the secrets its stage uses); with metrics on (`_metrics_wanted`), each worker
    process on its own metrics port from the planned one, listed in the scrape targets
    file."""
    state_dir = cli.state_dir
    supervisor = Supervisor()
    chosen = stack_ports or StackPorts()
    parser_cmd = parser_argv(env, chosen.parser)
    if parser_cmd:
        supervisor.add("parser", parser_cmd, env)
    if llm:
        supervisor.add("llm", llm_argv(env, chosen.llm), env)
    plan = metrics_ports(counts, chosen.metrics)
    ports = iter(plan)
    for name, count in counts.items():
        worker_env = {**env, **(service_env(state_dir, name) if embedded_nats else {}),
                      **secrets.env_for(name, env)}
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
            f"gRPC {info.gateway_grpc_address or 'off'}  "
            f"metrics {f'from :{info.metrics_port}' if info.metrics_port else 'off'}  "
            f"workers {', '.join(f'{n}x{c}' for n, c in counts.items())}")


def _run_until_stopped(supervisor: Supervisor, sync: AuthSync | None, state_dir: Path, *,
                       demo: Callable[[], None] | None, exit_after_demo: bool,
                       ready: Callable[[], object] | None = None,
                       keeper: ServerKeeper | None = None,
                       wait_idle: WaitIdle | None = None,
                       drain_timeout: float = DEFAULT_DRAIN_TIMEOUT) -> None:
    """Run the demo if asked, then keep the processes running until SIGINT / SIGTERM /
    SIGHUP (or the demo's end with `exit_after_demo`); then drain them in order
    (intentroute.drain: the doors and the gateways first, the servers kept meanwhile; a
    second signal stops at once) and remove the state files. The servers stop after this
    returns."""
    signals = StopSignals().install()
    try:
        if demo is not None:
            demo()
            if exit_after_demo:
                signals.count = max(signals.count, 1)
        if ready is not None and not signals.requested:
            ready()  # the ready screen, once every worker answers (intentroute.cli.ready)
        # A worker that dies is restarted (with backoff), and so is a server (the keeper:
        # same port, data and configuration); only a stop ends them all.
        while not signals.requested:
            if keeper is not None:
                keeper.poll()
            supervisor.poll()
            time.sleep(0.1)
    finally:
        typer.echo(f"intentroute up: stopping: no new requests; draining those in flight "
                   f"(up to {drain_timeout:g}s; Ctrl-C again stops at once)", err=True)
        drain(supervisor, signals, wait_idle, timeout=drain_timeout,
              tick=keeper.poll if keeper is not None else None)
        if sync is not None:
            sync.stop()
        (state_dir / "stack.json").unlink(missing_ok=True)
        (state_dir / METRICS_TARGETS).unlink(missing_ok=True)


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


async def _prepare_agents(state_dir: Path, db_url: str, nats_pids: list[int], *,
                          url: str = "", ca: str = "") -> None:
    """The demo agent and its credential file (naming the server(s) at `url`, with TLS
    the CA file `ca`), then every active agent into NATS."""
    from intentroute.stack.nats_users import DEMO_AGENT, apply_agents, ensure_agent_file
    from shared.store.agents import AgentStore

    store = await AgentStore.connect(db_url)
    try:
        await ensure_agent_file(store, state_dir, DEMO_AGENT, url=url, ca=ca)
        await apply_agents(store, state_dir, pids=nats_pids)
    finally:
        await store.close()


async def _declare_streams(
    nats_url: str, admin: dict[str, Any], response_ttl: float, replicas: int,
    limits: StreamLimits,
) -> None:
    import nats

    from shared.runtime.streams import ensure_streams

    nc = await nats.connect(nats_servers(nats_url), **admin)
    try:
        await ensure_streams(nc.jetstream(), response_ttl, replicas, limits=limits)
    finally:
        await nc.drain()
