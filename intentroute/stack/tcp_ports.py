"""Stable addresses for `intentroute up`: the ports of one state directory's stack.

Every port `up` picks (NATS client ports and, for a cluster, route ports; Postgres; the
doors' HTTP listener and, with `--grpc`, its gRPC one; the parser; the local model)
is written to `<state>/ports.json`, and the next `up` in that directory takes the same
ones again, so a client holding the old URL reconnects to the new stack. A port set
explicitly (`--nats-port` / `NATS_PORT`, `--postgres-port` / `POSTGRES_PORT`) wins over
the remembered one; 0 asks for a free port.

A port clients hold (NATS, Postgres, the doors' HTTP and gRPC) that is wanted (set
or remembered) and taken by another process is not swapped for a free one: `up` stops with
one line naming the port and how to choose another. A silently moved server is what
the stable ports exist to prevent (a client would keep trying the old address, or reach
whatever now listens there). The ports only `up`'s own processes use (cluster routes,
the parser, the local model) move to a free port when taken, and the banner says so;
so do the workers' metrics ports (a run of consecutive ones from 9464, Prometheus
finding them in `metrics_targets.json`).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from intentroute.stack.procs import StackError, free_port
from shared.common.otel import PROMETHEUS_PORT

PORTS_FILE = "ports.json"


class StackPorts(msgspec.Struct, kw_only=True):
    """0 / []: not chosen yet."""

    nats: list[int] = msgspec.field(default_factory=list)
    nats_routes: list[int] = msgspec.field(default_factory=list)
    postgres: int = 0
    gateway_http: int = 0
    parser: int = 0
    llm: int = 0
    gateway_grpc: int = 0
    # The first worker process's Prometheus endpoint; each next process takes the next.
    metrics: int = 0


class PortTakenError(StackError):
    """A wanted port is in use by another process (the message is the one line `up`
    prints)."""


def read_ports(state_dir: Path) -> StackPorts:
    """The ports the last `up` in this directory used (none when it never ran, or the
    file cannot be read: then every port is chosen afresh)."""
    path = state_dir / PORTS_FILE
    with contextlib.suppress(FileNotFoundError, msgspec.DecodeError, msgspec.ValidationError):
        return msgspec.json.decode(path.read_bytes(), type=StackPorts)
    return StackPorts()


def write_ports(state_dir: Path, ports: StackPorts) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / PORTS_FILE
    tmp = path.with_name(f".{PORTS_FILE}.{os.getpid()}")
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(ports)) + b"\n")
    os.replace(tmp, path)


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when a server could listen on `port` now. SO_REUSEADDR as the servers set it
    (nats-server, Postgres, uvicorn), so a port whose old connections linger in
    TIME_WAIT after a stop counts as free, as it is for them."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


class PortPlan:
    """Chooses each port once: the explicit one, else the remembered one, else a free
    one; checks a wanted one is free. `how_to_change` names, per server, the flag or
    variable that picks another port (for the one-line refusal)."""

    def __init__(self, state_dir: Path, *, is_free: Callable[[int], bool] = port_free,
                 pick: Callable[[], int] = free_port) -> None:
        self.state_dir = state_dir
        self.remembered = read_ports(state_dir)
        self.ports = StackPorts()
        self._is_free = is_free
        self._pick = pick
        self.reused: list[str] = []
        self.moved: list[str] = []

    def one(self, what: str, explicit: int | None, remembered: int, how_to_change: str = ""
            ) -> int:
        """A port clients hold is refused when taken; an internal one (no
        `how_to_change`: only `up`'s own processes use it) moves to a free port, said in
        the banner."""
        if explicit is not None and explicit < 0:
            raise PortTakenError(f"{what} port {explicit}: not a port")
        wanted, source = ((explicit, "set") if explicit is not None
                          else (remembered, f"remembered in {self.state_dir / PORTS_FILE}"))
        if not wanted:
            return self._fresh()
        if not self._is_free(wanted) and not how_to_change:
            port = self._fresh()
            self.moved.append(f"{what} {wanted} -> {port} (taken)")
            return port
        if not self._is_free(wanted):
            raise PortTakenError(
                f"{what} port {wanted} ({source}) is in use by another process: stop it, "
                f"or choose another port with {how_to_change} (0: any free port)")
        if explicit is None:
            self.reused.append(f"{what} {wanted}")
        return wanted

    def many(self, what: str, count: int, explicit_first: int | None, remembered: list[int],
             how_to_change: str) -> list[int]:
        """`count` ports: consecutive from an explicit first one, the remembered ones
        when there were as many, else free ones. The caller stores each choice in
        `ports` before the next (a fresh port is never one chosen already)."""
        if explicit_first:
            return [self.one(f"{what} {i + 1}", explicit_first + i, 0, how_to_change)
                    for i in range(count)]
        if explicit_first is None and len(remembered) == count:
            return [self.one(f"{what} {i + 1}" if count > 1 else what, None, port,
                             how_to_change) for i, port in enumerate(remembered)]
        fresh: list[int] = []
        while len(fresh) < count:
            port = self._fresh()
            if port not in fresh:
                fresh.append(port)
        return fresh

    def block(self, what: str, count: int, explicit: int | None, remembered: int,
              preferred: int) -> int:
        """The first of `count` consecutive ports: the explicit one as given, else the
        remembered one, else `preferred`, when all of them are free, else a free run
        (only `up`'s own processes listen there: moving is said in the banner)."""
        if explicit is not None:
            return explicit
        for base in (remembered, preferred):
            if base and self._run_free(base, count):
                if base == remembered:
                    self.reused.append(f"{what} {base}")
                return base
        while True:
            base = self._fresh()
            if self._run_free(base, count):
                if remembered:
                    self.moved.append(f"{what} {remembered} -> {base} (taken)")
                return base

    def _run_free(self, base: int, count: int) -> bool:
        taken = {*self.ports.nats, *self.ports.nats_routes, self.ports.postgres,
                 self.ports.gateway_http, self.ports.parser, self.ports.llm,
                 self.ports.gateway_grpc}
        ports = range(base, base + count)
        return ports[-1] <= 65535 and all(p not in taken and self._is_free(p) for p in ports)

    def _fresh(self) -> int:
        taken = {*self.ports.nats, *self.ports.nats_routes, self.ports.postgres,
                 self.ports.gateway_http, self.ports.parser, self.ports.llm,
                 self.ports.gateway_grpc}
        while True:
            port = self._pick()
            if port not in taken:
                return port

    def save(self) -> None:
        write_ports(self.state_dir, self.ports)

    def summary(self) -> str:
        """For the banner: which ports came back from the last run."""
        moved = f"; MOVED: {', '.join(self.moved)}" if self.moved else ""
        if not self.reused:
            return f"ports: new, kept for the next up in {PORTS_FILE}{moved}"
        return f"ports reused from the last up: {', '.join(self.reused)}{moved}"


class Wanted(NamedTuple):
    """What `up` runs here, and the ports set explicitly (None: not set)."""

    nats_nodes: int = 1  # 0: NATS_URL names an external server
    nats_port: int | None = None
    postgres: bool = True  # False: DATABASE_URL names an external one
    postgres_port: int | None = None
    gateway_http: bool = True  # the listener's port is up's to pick (GATEWAY_HTTP_LISTEN :0)
    parser: bool = True
    llm: bool = False
    gateway_grpc: bool = False  # `up --grpc` with GATEWAY_GRPC_LISTEN unset or at :0
    metrics: int = 0  # worker processes serving Prometheus metrics (0: none)
    metrics_port: int | None = None  # METRICS_PORT


def plan_ports(state_dir: Path, wanted: Wanted, **checks: Any) -> PortPlan:
    """Every port `up` needs, chosen before anything starts (a taken one stops `up`
    with PortTakenError and nothing started); `save()` once they all listen."""
    plan = PortPlan(state_dir, **checks)
    old, chosen = plan.remembered, plan.ports
    nodes = wanted.nats_nodes
    if nodes:
        chosen.nats = plan.many("NATS", nodes, wanted.nats_port, old.nats,
                                "--nats-port PORT or NATS_PORT")
        if nodes > 1:
            chosen.nats_routes = plan.many("NATS route", nodes, None, old.nats_routes, "")
    if wanted.postgres:
        chosen.postgres = plan.one("Postgres", wanted.postgres_port, old.postgres,
                                   "--postgres-port PORT or POSTGRES_PORT")
    if wanted.gateway_http:
        chosen.gateway_http = plan.one("gateway HTTP", None, old.gateway_http,
                                       "GATEWAY_HTTP_LISTEN=127.0.0.1:PORT")
    if wanted.gateway_grpc:
        chosen.gateway_grpc = plan.one("gateway gRPC", None, old.gateway_grpc,
                                       "GATEWAY_GRPC_LISTEN=127.0.0.1:PORT")
    if wanted.parser:
        chosen.parser = plan.one("parser", None, old.parser)
    if wanted.llm:
        chosen.llm = plan.one("local model", None, old.llm)
    if wanted.metrics:
        chosen.metrics = plan.block("metrics", wanted.metrics, wanted.metrics_port,
                                    old.metrics, PROMETHEUS_PORT)
    return plan
