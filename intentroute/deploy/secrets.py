"""What `intentroute deploy init` writes: a deployment's secrets, made the way the
embedded stack makes its own (intentroute.stack.nats_users, natsconf, pgroles), so compose and
Kubernetes run with the same users, permissions, admission key and Postgres roles as
`intentroute up`.

    <dir>/creds/        admin.json, intentroute-ops.json, intentroute-<worker>.json (the
                        NATS credentials, shared.auth.natsconn's format), admission.key
    <dir>/nats/         users.json (their bcrypt hashes), auth.conf (users + permissions,
                        agents included by `intentroute deploy nats-auth`), route (the
                        cluster's route secret) and route.hash, nats-<n>.conf (each
                        node's server part)
    <dir>/postgres/     superuser, roles/<role> (one password per role)
    <dir>/dashboard-token  the doors' dashboard token (GATEWAY_DASHBOARD_TOKEN_FILE)
    <dir>/gateway.env   the same token as an env file: GATEWAY_DASHBOARD_TOKEN=...

Every file is 0600 in 0700 directories. Running it again keeps every secret and
re-renders the configs (idempotent): a credential never changes under a running
deployment.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from intentroute.stack.nats_users import AuthFiles, ensure_service_users, write_auth, write_private
from intentroute.stack.natscluster import CLUSTER_NAME, ROUTE_USER
from intentroute.stack.natsconf import (
    DEFAULT_SYNC_INTERVAL,
    ClusterNode,
    account_names,
    server_config,
)
from intentroute.stack.pgroles import role_passwords
from shared.auth.identity import hash_secret

# Inside the NATS containers: the config directory (<dir>/nats mounted read-only), the
# JetStream store (a volume) and the ports compose and the KEDA scaler use.
NATS_CONFIG_DIR = "/etc/nats"
NATS_STORE_DIR = "/data"
NATS_CLIENT_PORT = 4222
NATS_ROUTE_PORT = 6222
NATS_MONITOR_PORT = 8222
# compose's node names, which are also their host names on its network.
NODE_PREFIX = "nats-"


class DeploySecrets(NamedTuple):
    root: Path

    @property
    def auth(self) -> AuthFiles:
        return AuthFiles(self.root / "nats", self.root / "creds")

    @property
    def postgres(self) -> Path:
        return self.root / "postgres"

    @property
    def superuser(self) -> Path:
        return self.postgres / "superuser"

    @property
    def route(self) -> Path:
        return self.auth.nats_dir / "route"

    @property
    def gateway_env(self) -> Path:
        return self.root / "gateway.env"

    @property
    def dashboard_token(self) -> Path:
        return self.root / "dashboard-token"

    def node_config(self, n: int) -> Path:
        return self.auth.nats_dir / f"{NODE_PREFIX}{n}.conf"


def init_secrets(root: Path, *, nodes: int = 3,
                 sync_interval: str = DEFAULT_SYNC_INTERVAL) -> DeploySecrets:
    """Create what is missing under `root` and render the NATS configs of `nodes`
    cluster nodes (1: a single server, no routes)."""
    if nodes < 1:
        raise ValueError(f"--nodes {nodes}: a deployment needs at least one NATS server")
    out = DeploySecrets(root)
    root.mkdir(parents=True, mode=0o700, exist_ok=True)
    root.chmod(0o700)
    files = out.auth
    files.nats_dir.mkdir(parents=True, mode=0o700, exist_ok=True)
    ensure_service_users(files)  # the service users' credentials, their hashes, the key
    if not files.auth.exists():  # a later `deploy nats-auth` added agents: keep them
        write_auth(files, agents=())
    role_passwords(out.postgres)
    out.postgres.chmod(0o700)
    _keep(out.superuser, secrets.token_urlsafe(24))
    # One token in both forms; a directory from before the token's own file keeps the
    # token its gateway.env holds.
    token = _keep(out.dashboard_token, _env_value(out.gateway_env) or secrets.token_urlsafe(32))
    _keep(out.gateway_env, f"GATEWAY_DASHBOARD_TOKEN={token}")
    route_secret = _keep(out.route, secrets.token_urlsafe(24))
    # bcrypt: the route URLs carry the secret, the nodes keep only its hash (made once,
    # so a rerun renders the same configs).
    route_hash = _keep(out.route.with_suffix(".hash"), hash_secret(route_secret))
    for n in range(1, nodes + 1):
        write_private(out.node_config(n),
                      node_config(n, nodes, route_secret, route_hash, sync_interval))
    return out


def node_config(n: int, nodes: int, route_secret: str, route_hash: str,
                sync_interval: str = DEFAULT_SYNC_INTERVAL) -> str:
    """Node `n`'s server part: clients, JetStream, the monitoring port (health checks,
    KEDA's scaler), and with several nodes the cluster with authenticated routes; it
    includes auth.conf from the same directory."""
    node = None
    if nodes > 1:
        routes = tuple(f"nats-route://{ROUTE_USER}:{route_secret}@{NODE_PREFIX}{m}:"
                       f"{NATS_ROUTE_PORT}" for m in range(1, nodes + 1))
        node = ClusterNode(cluster=CLUSTER_NAME, server_name=f"{NODE_PREFIX}{n}",
                           port=NATS_ROUTE_PORT, routes=routes, user=ROUTE_USER,
                           password_hash=route_hash)
    text = server_config(host="0.0.0.0", port=NATS_CLIENT_PORT, store_dir=NATS_STORE_DIR,
                         pid_file=f"{NATS_STORE_DIR}/nats-server.pid", node=node,
                         sync_interval=sync_interval)
    # Monitoring (/healthz, /jsz) answers anyone who reaches the port: it is published
    # on no host port, and shows no secret (user names only with ?auth=true).
    return text + f'http: "0.0.0.0:{NATS_MONITOR_PORT}"\n'


def render_agents(root: Path, agents: Iterable[tuple[str, str]]) -> int:
    """auth.conf for the service users and these (agent id, secret hash) pairs; the
    reloads (SIGHUP) the servers then need: 0 (unchanged), 1, or 2 when it added an
    agent's account (nats-server wires a new account's service imports only on the
    reload after the one that created it: intentroute.stack.nats_users.apply_agents)."""
    files = DeploySecrets(root).auth
    conf = files.auth
    before = account_names(conf.read_text(encoding="utf-8")) if conf.exists() else set()
    if not write_auth(files, agents):
        return 0
    return 2 if account_names(conf.read_text(encoding="utf-8")) - before else 1


def _env_value(path: Path) -> str:
    """The value of an env file's one `NAME=value` line ("" without the file)."""
    if not path.exists():
        return ""
    return path.read_text(encoding="utf-8").strip().partition("=")[2]


def _keep(path: Path, fresh: str) -> str:
    """The secret in `path`, written as `fresh` the first time."""
    if not path.exists():
        write_private(path, fresh + "\n")
    return path.read_text(encoding="utf-8").strip()
