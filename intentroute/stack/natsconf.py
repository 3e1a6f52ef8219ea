"""nats-server configuration as text, from pure data (unit-tested without a server).

Two files: the server part (listen address, JetStream and its sync policy, TLS, and for
a cluster node its name and routes), written once at start, includes the auth part
(the accounts: the stack's own with the streams and its users, one per agent importing
only its own subjects — see shared.auth.permissions — users with bcrypt password hashes
and their permissions), which is rewritten and reloaded whenever agents change. Values
are JSON-quoted: in the NATS config format an unquoted `$...` (every bcrypt hash) is a
variable reference. There is no `no_auth_user`: a connection without a credential is refused.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from shared.auth.permissions import (
    ADMIN_USER,
    APP_ACCOUNT,
    APP_EXPORTS,
    OPS_USER,
    SERVICE_USERS,
    Export,
    Import,
    Permissions,
    agent_id_problem,
    agent_imports,
    agent_permissions,
    ops_permissions,
    service_permissions,
)

log = logging.getLogger("intentroute.stack")

AUTH_FILE = "auth.conf"

# How often JetStream fsyncs its file store (nats-server's own default is 2 min). A
# message is acknowledged once written (to the OS); a host crash loses what was not
# synced yet: up to this long, or nothing with "always" (an fsync per write).
DEFAULT_SYNC_INTERVAL = "1s"
_SYNC_INTERVAL = re.compile(r"always|[1-9][0-9]*(ms|s|m|h)")


def sync_interval_problem(value: str) -> str:
    """Why `value` is not a JetStream sync policy, or "" when it is."""
    if _SYNC_INTERVAL.fullmatch(value):
        return ""
    return f"{value!r}: use 'always' or a duration such as 100ms, 1s, 2m"


class User(NamedTuple):
    name: str
    password_hash: str
    # None: no restriction (the admin).
    permissions: Permissions | None
    # The account it belongs to: "" for the stack's (APP_ACCOUNT), else an agent's own,
    # which imports `imports` from the stack's.
    account: str = ""
    imports: tuple[Import, ...] = ()


class ClusterNode(NamedTuple):
    """One node's part of a cluster: its name, its route listener, every node's route
    URL (a node ignores its own), and the route user (password bcrypt-hashed here; the
    route URLs carry the secret)."""

    cluster: str
    server_name: str
    port: int
    routes: tuple[str, ...]
    user: str
    password_hash: str


class ServerTls(NamedTuple):
    cert: str
    key: str
    # With a CA the server also requires and verifies client certificates.
    ca: str = ""


def server_config(
    *,
    host: str,
    port: int,
    store_dir: str,
    pid_file: str,
    tls: ServerTls | None = None,
    auth: bool = True,
    sync_interval: str = DEFAULT_SYNC_INTERVAL,
    node: ClusterNode | None = None,
    auth_file: str = AUTH_FILE,
) -> str:
    """The server part; with `auth` it includes `auth_file` (relative to this file)."""
    problem = sync_interval_problem(sync_interval)
    if problem:
        raise ValueError(f"JetStream sync interval {problem}")
    lines = [
        f"listen: {_q(f'{host}:{port}')}",
        f"jetstream: {_j({'store_dir': store_dir, 'sync_interval': sync_interval})}",
        f"pid_file: {_q(pid_file)}",
    ]
    if node is not None:
        lines.append(f"server_name: {_q(node.server_name)}")
        lines.append(f"cluster: {_j(_cluster_block(host, node))}")
    if tls is not None:
        block: dict[str, Any] = {"cert_file": tls.cert, "key_file": tls.key, "timeout": 5}
        if tls.ca:
            block.update(ca_file=tls.ca, verify=True)
        lines.append(f"tls: {_j(block)}")
    if auth:
        lines.append(f"include {_q(auth_file)}")
    return "\n".join(lines) + "\n"


def auth_config(users: Iterable[User]) -> str:
    """The auth part: the accounts, their users and what each may publish and subscribe
    to. The stack's account holds JetStream and exports `APP_EXPORTS`; each agent's
    account holds that agent and its imports."""
    users = list(users)
    names = [user.name for user in users]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate NATS users: {sorted(names)}")
    accounts: dict[str, Any] = {APP_ACCOUNT: {
        "jetstream": "enabled",
        "users": [_user_entry(u) for u in users if not u.account],
        "exports": [_export_entry(e) for e in APP_EXPORTS],
    }}
    for user in users:
        if user.account:
            if user.account in accounts:
                raise ValueError(f"duplicate NATS account: {user.account!r}")
            accounts[user.account] = {
                "users": [_user_entry(user)],
                "imports": [{i.kind: {"account": APP_ACCOUNT, "subject": i.subject}}
                            for i in user.imports],
            }
    return f"accounts: {_j(accounts)}\n"


def account_names(auth_text: str) -> set[str]:
    """The accounts an auth part (auth_config's text) declares; empty if none parses."""
    try:
        body = json.loads(auth_text.partition(":")[2])
    except ValueError:
        return set()
    return set(body) if isinstance(body, dict) else set()


def _export_entry(export: Export) -> dict[str, Any]:
    entry: dict[str, Any] = {export.kind: export.subject}
    if export.response_type:
        entry["response_type"] = export.response_type
    if export.response_seconds:
        # How long the server keeps the reply mapping of one request open.
        entry["response_threshold"] = f"{export.response_seconds:g}s"
    return entry


def stack_users(
    service_hashes: Mapping[str, str], agents: Iterable[tuple[str, str]]
) -> list[User]:
    """The admin, the ops reader and the service users (hashes by user name), then one
    user per active agent (agent id, secret hash). A row whose id is not a valid agent
    id or is a reserved name is left out: it could never be a subject token of its own."""
    users = [User(ADMIN_USER, service_hashes[ADMIN_USER], None),
             User(OPS_USER, service_hashes[OPS_USER], ops_permissions())]
    users += [
        User(name, service_hashes[name], service_permissions(worker))
        for name, worker in SERVICE_USERS.items()
    ]
    for agent_id, secret_hash in agents:
        problem = agent_id_problem(agent_id)
        if problem:
            log.warning("agent %r left out of the NATS users: %s", agent_id, problem)
            continue
        users.append(User(agent_id, secret_hash, agent_permissions(agent_id),
                          account=agent_id, imports=agent_imports(agent_id)))
    return users


def _cluster_block(host: str, node: ClusterNode) -> dict[str, Any]:
    # Routes are authenticated too: nothing on the host joins the cluster without the
    # route secret. A node forwards clients the others' URLs (no_advertise off).
    return {
        "name": node.cluster,
        "listen": f"{host}:{node.port}",
        "authorization": {"user": node.user, "password": node.password_hash, "timeout": 2},
        "routes": list(node.routes),
    }


def _user_entry(user: User) -> dict[str, Any]:
    entry: dict[str, Any] = {"user": user.name, "password": user.password_hash}
    perms = user.permissions
    if perms is not None:
        entry["permissions"] = {
            "publish": {"allow": list(perms.publish)},
            "subscribe": {"allow": list(perms.subscribe)},
        }
        if perms.allow_responses and perms.max_responses > 1:
            entry["permissions"]["allow_responses"] = {
                "max": perms.max_responses, "expires": f"{perms.responses_seconds:g}s"}
        elif perms.allow_responses:
            entry["permissions"]["allow_responses"] = True
    return entry


def _q(text: str) -> str:
    return json.dumps(text)


def _j(value: object) -> str:
    return json.dumps(value, indent=2)
