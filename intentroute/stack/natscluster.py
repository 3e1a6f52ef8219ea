"""A NATS cluster on loopback: `size` nats-server processes (the same wheel) joined by
authenticated routes, JetStream clustered, the users of a single server.

Node `n` keeps its data in `<data_dir>/node-<n>/` and its name (`n<n>`) across
restarts, which is what JetStream's replication groups know it by; its ports are the
ones given (`up` keeps them across runs), else chosen afresh at the cluster's start.
Every node includes the same auth part (`<data_dir>/auth.conf`), so an agent added or
revoked reaches all of them when each is reloaded (`intentroute.stack.nats_users.server_pids`
finds them by their pid files).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from pathlib import Path

from intentroute.stack.natsconf import DEFAULT_SYNC_INTERVAL, ClusterNode, ServerTls
from intentroute.stack.natsserver import NatsServer
from intentroute.stack.procs import StackError, free_port, wait_tcp
from shared.auth.identity import hash_secret

CLUSTER_NAME = "intentroute"
ROUTE_USER = "route"


def _free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


class NatsCluster:
    """`size` (≥ 3: a JetStream group keeps a quorum with one node lost) nodes."""

    def __init__(
        self,
        data_dir: Path,
        size: int = 3,
        *,
        creds_dir: Path | None = None,
        tls: ServerTls | None = None,
        sync_interval: str = DEFAULT_SYNC_INTERVAL,
        client_ports: Sequence[int] = (),
        route_ports: Sequence[int] = (),
    ) -> None:
        if size < 3:
            raise StackError(f"a NATS cluster needs at least 3 nodes, not {size}: with 2, "
                             "losing either loses the quorum of every replicated stream")
        self.data_dir = data_dir.resolve()
        # One secret per run of the cluster: the route URLs carry it, the nodes keep
        # its bcrypt hash; a node restarted alone reuses its config.
        secret = secrets.token_urlsafe(24)
        secret_hash = hash_secret(secret)
        # The ports given (`up` keeps them across its runs: intentroute.stack.tcp_ports),
        # else free ones.
        ports = _free_ports(2 * size)
        client_ports = list(client_ports) or ports[:size]
        self.route_ports = list(route_ports) or ports[size:]
        if len(client_ports) != size or len(self.route_ports) != size:
            raise StackError(f"a cluster of {size} needs {size} client and route ports")
        routes = tuple(f"nats-route://{ROUTE_USER}:{secret}@127.0.0.1:{p}"
                       for p in self.route_ports)
        self.nodes = [
            NatsServer(
                self.data_dir / f"node-{n}", client_ports[n - 1], creds_dir=creds_dir,
                tls=tls, sync_interval=sync_interval, auth_dir=self.data_dir,
                node=ClusterNode(cluster=CLUSTER_NAME, server_name=f"n{n}",
                                 port=self.route_ports[n - 1], routes=routes,
                                 user=ROUTE_USER, password_hash=secret_hash),
            )
            for n in range(1, size + 1)
        ]

    @property
    def url(self) -> str:
        """Every node's client URL, comma-separated (`NATS_URL` takes such a list)."""
        return ",".join(node.url for node in self.nodes)

    @property
    def pids(self) -> list[int]:
        return [node.pid for node in self.nodes if node.pid]

    def node(self, name: str) -> NatsServer:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no node {name!r} in the cluster")

    def start(self, timeout: float = 15.0) -> NatsCluster:
        """Start every node, then wait until each listens for clients and routes. The
        JetStream leaders are elected a moment later: `shared.runtime.streams.ensure_streams`
        waits for them."""
        try:
            for node in self.nodes:
                node.launch()
            for node, route_port in zip(self.nodes, self.route_ports, strict=True):
                node.wait_ready(timeout)
                assert node.proc is not None
                wait_tcp("127.0.0.1", route_port, timeout, node.proc)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
