"""An `up` killed with -9 left its stack.json: the next `up` waits for the servers it
names (still running from this state directory) and the remembered ports clients hold,
up to a limit, and says what still held on (fake ports and clock; real processes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from intentroute.stack.leftovers import (
    client_ports_held,
    server_pids_left,
    wait_for_leftovers,
)
from intentroute.stack.state import StackInfo, write_state
from intentroute.stack.tcp_ports import StackPorts, write_ports
from testkit.clocks import ManualClock


def _info(nats_pid: int = 0, postgres_pid: int = 0) -> StackInfo:
    """A dead `up`'s stack.json (its pid no longer runs)."""
    return StackInfo(nats_url="nats://127.0.0.1:4222", database_url="", pid=999_999,
                     nats_pid=nats_pid, nats_pids=[nats_pid] if nats_pid else [],
                     postgres_pid=postgres_pid)


def test_no_stack_json_no_wait(tmp_path: Path) -> None:
    clock = ManualClock()
    left = wait_for_leftovers(tmp_path, is_free=lambda _: False, clock=clock,
                              sleep=clock.sleep)
    assert left.dead_pid == 0
    assert left.held == ()
    assert clock.now == 0.0


def test_waits_until_the_remembered_client_ports_are_free(tmp_path: Path) -> None:
    write_state(tmp_path, _info())
    write_ports(tmp_path, StackPorts(nats=[4222], postgres=5432, gateway_http=8080,
                                     parser=9000))
    clock = ManualClock()
    # Postgres's port is released 1.5 s after the wait began; the parser's is internal
    # (`up` moves it when taken), so it is not waited for.
    left = wait_for_leftovers(tmp_path, is_free=lambda port: port != 5432 or clock.now >= 1.5,
                              clock=clock, sleep=clock.sleep)
    assert left.dead_pid == 999_999
    assert left.held == ("port 5432",)
    assert left.holding == ()
    assert 1.5 <= left.waited < 1.7


def test_gives_up_after_the_timeout_naming_what_still_holds(tmp_path: Path) -> None:
    write_state(tmp_path, _info())
    write_ports(tmp_path, StackPorts(nats=[4222]))
    clock = ManualClock()
    left = wait_for_leftovers(tmp_path, timeout=5.0, is_free=lambda _: False, clock=clock,
                              sleep=clock.sleep)
    assert left.holding == ("port 4222",)
    assert 5.0 <= left.waited < 5.2


def test_only_servers_running_from_this_state_dir_are_waited_for(tmp_path: Path) -> None:
    state_dir = tmp_path / "home"
    # A process whose command line names the state directory, as nats-server's
    # (`-c <state>/nats/nats-server.conf`) and Postgres's (`-D <state>/postgres/pgdata`).
    server = subprocess.Popen([sys.executable, "-c", "import time; print(); time.sleep(60)",
                               str(state_dir / "nats" / "nats-server.conf")],
                              stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None
        server.stdout.readline()  # exec'd: its command line is its own
        info = _info(nats_pid=server.pid, postgres_pid=os.getpid())
        assert server_pids_left(info, state_dir) == [server.pid]  # ours; this one is not
        server.kill()
        server.wait(10)
        assert server_pids_left(info, state_dir) == []
    finally:
        server.kill()


def test_client_ports_held_leaves_out_unset_and_internal_ports() -> None:
    ports = StackPorts(nats=[1, 2], postgres=3, gateway_http=0, gateway_grpc=4, parser=5,
                       llm=6, metrics=7)
    assert client_ports_held(ports, is_free=lambda _: False) == [1, 2, 3, 4]
