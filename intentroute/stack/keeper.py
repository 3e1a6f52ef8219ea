"""Keeps the embedded servers of `intentroute up` running, as the supervisor keeps the
workers: a nats-server (each node of a cluster) or Postgres that dies is started again
by the same object, so on the same port, with the same data directory and the same
configuration (a cluster node keeps its name, route port and route secret).

A server that keeps dying backs off (0.2 s first, doubling to 10 s; one that ran
`HEALTHY_AFTER` counts as healthy again), like a worker. A start that fails (the port
taken meanwhile, Postgres refusing while a killed postmaster's backends still hold its
shared memory) is one more failure, tried again after the backoff. `on_restart` runs
after each successful restart with the server's label (`up` rewrites stack.json's pids
and points the agents' sync at the new process).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from intentroute.stack.nats_users import AuthSync
from intentroute.stack.natsserver import NatsServer
from intentroute.stack.postgres import PostgresServer
from intentroute.stack.procs import StackError
from intentroute.stack.state import StackInfo, write_state

log = logging.getLogger("intentroute.stack")

FIRST_DELAY = 0.2
MAX_DELAY = 10.0
HEALTHY_AFTER = 30.0


class Process(Protocol):
    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...


class Server(Protocol):
    """What NatsServer and PostgresServer share: their process and a start that waits
    until the server listens."""

    @property
    def proc(self) -> Process | None: ...

    def start(self) -> object: ...

    def stop(self) -> None: ...


@dataclass
class Kept:
    label: str
    server: Server
    started: float = 0.0
    failures: int = 0
    restart_at: float | None = None
    restarts: int = 0
    # When the last restart's start() returned: the server listened (tools/bench/chaos.py
    # counts the stall from here).
    listening_at: float = 0.0


class ServerKeeper:
    def __init__(self, servers: Iterable[tuple[str, Server]], *,
                 on_restart: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        now = clock()
        self.kept = [Kept(label, server, started=now) for label, server in servers]
        self.on_restart = on_restart

    def poll(self) -> list[str]:
        """Start again what died (once its backoff has passed); the labels restarted.
        A start blocks until the server listens (a second or two for Postgres)."""
        restarted: list[str] = []
        for kept in self.kept:
            self._notice_death(kept)
            due = kept.restart_at is not None and self._clock() >= kept.restart_at
            if due and self._restart(kept):
                restarted.append(kept.label)
        return restarted

    def _notice_death(self, kept: Kept) -> None:
        """Notice a death once: schedule the restart after the backoff."""
        proc = kept.server.proc
        if kept.restart_at is not None or proc is None or proc.poll() is None:
            return
        now = self._clock()
        kept.failures = 1 if now - kept.started >= HEALTHY_AFTER else kept.failures + 1
        delay = min(MAX_DELAY, FIRST_DELAY * 2 ** (kept.failures - 1))
        kept.restart_at = now + delay
        log.warning("%s (pid %d) exited with %s; restarting it on the same port in %.1fs",
                    kept.label, proc.pid, proc.returncode, delay)

    def _restart(self, kept: Kept) -> bool:
        kept.started = self._clock()
        try:
            kept.server.start()
        except (StackError, OSError) as exc:
            with contextlib.suppress(StackError, OSError):
                kept.server.stop()  # a half-started process must not linger
            kept.failures += 1
            delay = min(MAX_DELAY, FIRST_DELAY * 2 ** (kept.failures - 1))
            kept.restart_at = self._clock() + delay
            log.warning("%s did not start again (%s); next try in %.1fs", kept.label, exc,
                        delay)
            return False
        kept.listening_at = self._clock()
        kept.restart_at = None
        kept.restarts += 1
        proc = kept.server.proc
        log.warning("%s restarted (pid %d, restart %d)", kept.label, proc.pid if proc else 0,
                    kept.restarts)
        if self.on_restart is not None:
            self.on_restart(kept.label)
        return True


def stack_keeper(servers: list[tuple[str, NatsServer | PostgresServer]], state_dir: Path,
                 info: StackInfo, sync: AuthSync | None) -> ServerKeeper:
    """`up`'s keeper: after a restart stack.json names the running servers' pids again
    (`agent add` signals them) and the agents' sync reloads the new nats-server."""

    def restarted(_label: str) -> None:
        update_pids(info, servers)
        write_state(state_dir, info)
        if sync is not None:
            sync.pids = tuple(info.nats_pids)

    return ServerKeeper(servers, on_restart=restarted)


def update_pids(info: StackInfo, servers: list[tuple[str, NatsServer | PostgresServer]]
                ) -> None:
    """The running servers' pids into `info` (nats_pid: the first node's)."""
    nats = [server.pid for _, server in servers
            if isinstance(server, NatsServer) and server.pid]
    info.nats_pids = nats
    info.nats_pid = nats[0] if nats else 0
    info.postgres_pid = next((server.proc.pid for _, server in servers
                              if isinstance(server, PostgresServer) and server.proc), 0)
