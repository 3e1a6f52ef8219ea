"""What an `intentroute up` that died without stopping its stack (kill -9, an OOM kill)
leaves behind, and the next `up` waiting for it to go.

Its servers and workers were sent their stop signal by the kernel as it died
(`procs.die_with_parent`: SIGTERM to nats-server and the workers, SIGINT to Postgres) and
take a moment to stop: after a kill -9 of `up` (1 replica of each worker, load average
8-10 on the 2-core machine) all of them were gone 1.5 s later idle, 2.6 s later with 52
requests unanswered (tests/integration/test_up_kill9.py). A next `up` started at once
found the remembered Postgres port still taken and exited 2, 1 run in 2. So `up`, once it
holds the state directory's lock (no `up` runs there), reads the dead one's `stack.json`
(a clean stop removes it) and waits, up to `LEFTOVER_WAIT`, until the servers it names
are gone and the remembered ports clients hold are free (the gateway's, so its old
replicas too); then it plans its ports as always (one still taken then is refused in one
line, as any taken port). The other old workers are not waited for: one still draining
may reach the new servers (same users) before it exits; in the test two old generators
did (their logs show the new Postgres starting up), and every request still had one
final.

Its other files need nothing: the lock goes with the process, `stack.json` naming a
dead pid counts as no stack (`state.read_state`) and is rewritten, a nats-server pid
file naming a dead or foreign process is skipped (`auth.server_pids`, `reload_server`
checks the command line), Postgres's fast shutdown removes `postmaster.pid`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import msgspec

from intentroute.stack.state import STATE_FILE, StackInfo
from intentroute.stack.tcp_ports import StackPorts, port_free, read_ports

# Long enough for the workers' drain on SIGTERM (`up` itself gives them 20 s before a
# SIGKILL) and Postgres's shutdown checkpoint on a loaded machine.
LEFTOVER_WAIT = 30.0


class Leftovers(NamedTuple):
    """What a dead `up` left: its pid, what held on when the wait began ("pid N" /
    "port N"; empty: nothing, no wait), the seconds waited, what still held on when it
    ended (empty: all gone)."""

    dead_pid: int = 0
    held: tuple[str, ...] = ()
    waited: float = 0.0
    holding: tuple[str, ...] = ()


def left_behind(state_dir: Path) -> StackInfo | None:
    """`stack.json` of an `up` that ended without removing it (None: there is none or it
    cannot be read). Call it with the state directory's lock held (`lock.StateLock`): no
    `up` runs there then, so the file is a dead one's whether or not its pid has been
    taken by another process since."""
    try:
        return msgspec.json.decode((state_dir / STATE_FILE).read_bytes(), type=StackInfo)
    except (FileNotFoundError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def server_pids_left(info: StackInfo, state_dir: Path) -> list[int]:
    """The servers `info` names that still run from `state_dir` (a pid taken since by
    another process, or a zombie, has another or no command line)."""
    marker = str(state_dir.resolve()).encode()
    return [pid for pid in dict.fromkeys([*info.nats_pids, info.nats_pid, info.postgres_pid])
            if pid > 0 and marker in _cmdline(pid)]


def client_ports_held(ports: StackPorts, is_free: Callable[[int], bool] = port_free
                      ) -> list[int]:
    """The remembered ports clients hold (NATS, Postgres, the doors' HTTP and gRPC)
    that something still listens on."""
    wanted = [*ports.nats, ports.postgres, ports.gateway_http, ports.gateway_grpc]
    return [port for port in wanted if port and not is_free(port)]


def wait_for_leftovers(state_dir: Path, timeout: float = LEFTOVER_WAIT, *,
                       is_free: Callable[[int], bool] = port_free,
                       clock: Callable[[], float] = time.monotonic,
                       sleep: Callable[[float], None] = time.sleep) -> Leftovers:
    """Wait (up to `timeout`) for what a dead `up` of `state_dir` left running."""
    info = left_behind(state_dir)
    if info is None:
        return Leftovers()
    remembered = read_ports(state_dir)

    def holding() -> tuple[str, ...]:
        return (*(f"pid {pid}" for pid in server_pids_left(info, state_dir)),
                *(f"port {port}" for port in client_ports_held(remembered, is_free)))

    held = still = holding()
    start = clock()
    while still and clock() - start < timeout:
        sleep(0.1)
        still = holding()
    return Leftovers(info.pid, held, clock() - start if held else 0.0, still)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
