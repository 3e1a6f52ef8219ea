"""The keeper of `up`'s servers (restart on the same object, backoff, stack.json's pids
follow) and the port plan (explicit > remembered > free; a taken port clients hold is
refused in one line, an internal one moves); the stack users' cheap hashes."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import bcrypt
import pytest

from intentroute.stack.keeper import ServerKeeper
from intentroute.stack.nats_users import (
    SERVICE_BCRYPT_COST,
    auth_files,
    bcrypt_cost,
    ensure_service_users,
)
from intentroute.stack.procs import StackError
from intentroute.stack.tcp_ports import (
    PORTS_FILE,
    PortTakenError,
    StackPorts,
    Wanted,
    plan_ports,
    port_free,
    write_ports,
)
from shared.auth.identity import hash_secret
from shared.auth.natsconn import read_credential
from shared.auth.permissions import STACK_USERS
from testkit.clocks import ManualClock
from testkit.procs import FakeProc


class FakeServer:
    def __init__(self, fail_starts: int = 0) -> None:
        self.proc: FakeProc | None = FakeProc(pid=100)
        self.starts = 0
        self.fail_starts = fail_starts
        self.stops = 0

    def start(self) -> FakeServer:
        self.starts += 1
        if self.fail_starts:
            self.fail_starts -= 1
            raise StackError("port in use")
        self.proc = FakeProc(pid=100 + self.starts)
        return self

    def stop(self) -> None:
        self.stops += 1
        self.proc = None


def test_a_dead_server_is_started_again_after_the_first_delay_and_reported() -> None:
    clock, server, seen = ManualClock(1000.0), FakeServer(), list[str]()
    keeper = ServerKeeper([("nats-server", server)], on_restart=seen.append, clock=clock)
    assert keeper.poll() == []
    assert server.proc is not None
    server.proc.returncode = -9
    assert keeper.poll() == []  # noticed; restarts after 0.2 s
    clock.now += 0.25
    assert keeper.poll() == ["nats-server"]
    assert server.starts == 1
    assert server.proc.pid == 101
    assert seen == ["nats-server"]
    assert keeper.kept[0].listening_at == clock.now
    assert keeper.poll() == []  # alive: nothing more


def test_a_server_that_keeps_dying_backs_off_and_a_failed_start_is_tried_again() -> None:
    clock, server = ManualClock(1000.0), FakeServer(fail_starts=1)
    keeper = ServerKeeper([("postgres", server)], clock=clock)
    assert server.proc is not None
    server.proc.returncode = -9
    keeper.poll()
    clock.now += 0.25
    assert keeper.poll() == []  # the start failed: stopped, tried again later
    assert server.stops == 1
    clock.now += 0.25
    assert keeper.poll() == []  # 0.4 s after the failure, not yet
    clock.now += 0.2
    assert keeper.poll() == ["postgres"]
    assert server.proc is not None
    server.proc.returncode = 1  # died again at once: a longer delay
    keeper.poll()
    clock.now += 0.5
    assert keeper.poll() == []
    clock.now += 0.4
    assert keeper.poll() == ["postgres"]


def test_ports_explicit_then_remembered_then_free(tmp_path: Path) -> None:
    write_ports(tmp_path, StackPorts(nats=[4301], postgres=4302, gateway_http=4303, parser=4304))
    picks = iter(range(5000, 5100))
    plan = plan_ports(tmp_path, Wanted(nats_port=4400), is_free=lambda _p: True,
                      pick=lambda: next(picks))
    assert plan.ports.nats == [4400]  # set: wins
    assert (plan.ports.postgres, plan.ports.gateway_http, plan.ports.parser) == (4302, 4303,
                                                                                  4304)
    assert "ports reused" in plan.summary()
    assert "Postgres 4302" in plan.summary()
    plan.save()
    assert json.loads((tmp_path / PORTS_FILE).read_text())["nats"] == [4400]
    fresh = plan_ports(tmp_path / "new", Wanted(nats_nodes=3, postgres_port=0),
                       is_free=lambda _p: True, pick=lambda: next(picks))
    chosen = [*fresh.ports.nats, *fresh.ports.nats_routes, fresh.ports.postgres]
    assert len(set(chosen)) == 7
    assert all(port >= 5000 for port in chosen)
    assert fresh.summary().startswith("ports: new")


def test_a_taken_port_clients_hold_refuses_and_an_internal_one_moves(tmp_path: Path) -> None:
    write_ports(tmp_path, StackPorts(nats=[4301], postgres=4302, parser=4304))
    with pytest.raises(PortTakenError) as refused:
        plan_ports(tmp_path, Wanted(), is_free=lambda p: p != 4302, pick=lambda: 6000)
    message = str(refused.value)
    assert "Postgres port 4302" in message
    assert "in use by another process" in message
    assert "--postgres-port" in message
    assert "\n" not in message
    picks = iter(range(6001, 6100))
    plan = plan_ports(tmp_path, Wanted(), is_free=lambda p: p != 4304, pick=lambda: next(picks))
    assert plan.ports.gateway_http == 6001  # none remembered: a free one
    assert plan.ports.parser == 6002
    assert "MOVED: parser 4304 -> 6002" in plan.summary()


def test_port_free_sees_a_listener() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert not port_free(port)
    assert port_free(port)


def test_stack_users_get_cheap_hashes_of_the_same_secrets(tmp_path: Path) -> None:
    files = auth_files(tmp_path)
    hashes = ensure_service_users(files)
    assert set(hashes) == set(STACK_USERS)
    assert {bcrypt_cost(h) for h in hashes.values()} == {SERVICE_BCRYPT_COST}
    # An older state dir: cost-10 hashes of the same secrets are remade, secrets kept.
    secrets_before = {u: read_credential(files.credential(u)).nats["password"]
                      for u in STACK_USERS}
    files.hashes.write_text(json.dumps({u: hash_secret(s) for u, s in secrets_before.items()}))
    remade = ensure_service_users(files)
    for user, secret in secrets_before.items():
        assert read_credential(files.credential(user)).nats["password"] == secret
        assert bcrypt_cost(remade[user]) == SERVICE_BCRYPT_COST
        assert bcrypt.checkpw(secret.encode(), remade[user].encode())
        assert not bcrypt.checkpw(b"x" + secret.encode(), remade[user].encode())
