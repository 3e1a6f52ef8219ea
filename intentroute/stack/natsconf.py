"""nats-server configuration as text, from pure data (unit-tested without a server).

Two files: the server part (listen address, JetStream, TLS), written once at start,
includes the auth part (users with bcrypt password hashes and their permissions),
which is rewritten and reloaded whenever agents change. Values are JSON-quoted: in
the NATS config format an unquoted `$...` (every bcrypt hash) is a variable reference.
There is no `no_auth_user`: a connection without a credential is refused.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from shared.natsauth import (
    ADMIN_USER,
    SERVICE_USERS,
    Permissions,
    agent_id_problem,
    agent_permissions,
    service_permissions,
)

log = logging.getLogger("intentroute.stack")

AUTH_FILE = "auth.conf"


class User(NamedTuple):
    name: str
    password_hash: str
    # None: no restriction (the admin).
    permissions: Permissions | None


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
) -> str:
    """The server part; with `auth` it includes AUTH_FILE from the same directory."""
    lines = [
        f"listen: {_q(f'{host}:{port}')}",
        f"jetstream: {_j({'store_dir': store_dir})}",
        f"pid_file: {_q(pid_file)}",
    ]
    if tls is not None:
        block: dict[str, Any] = {"cert_file": tls.cert, "key_file": tls.key, "timeout": 5}
        if tls.ca:
            block.update(ca_file=tls.ca, verify=True)
        lines.append(f"tls: {_j(block)}")
    if auth:
        lines.append(f"include {_q(AUTH_FILE)}")
    return "\n".join(lines) + "\n"


def auth_config(users: Iterable[User]) -> str:
    """The auth part: the users and what each may publish and subscribe to."""
    entries = [_user_entry(user) for user in users]
    names = [entry["user"] for entry in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate NATS users: {sorted(names)}")
    return f"authorization: {_j({'users': entries})}\n"


def stack_users(
    service_hashes: Mapping[str, str], agents: Iterable[tuple[str, str]]
) -> list[User]:
    """The admin and service users (hashes by user name, the admin's included), then one
    user per active agent (agent id, secret hash). A row whose id is not a valid agent
    id or is a reserved name is left out: it could never be a subject token of its own."""
    users = [User(ADMIN_USER, service_hashes[ADMIN_USER], None)]
    users += [
        User(name, service_hashes[name], service_permissions(worker))
        for name, worker in SERVICE_USERS.items()
    ]
    for agent_id, secret_hash in agents:
        problem = agent_id_problem(agent_id)
        if problem:
            log.warning("agent %r left out of the NATS users: %s", agent_id, problem)
            continue
        users.append(User(agent_id, secret_hash, agent_permissions(agent_id)))
    return users


def _user_entry(user: User) -> dict[str, Any]:
    entry: dict[str, Any] = {"user": user.name, "password": user.password_hash}
    perms = user.permissions
    if perms is not None:
        entry["permissions"] = {
            "publish": {"allow": list(perms.publish)},
            "subscribe": {"allow": list(perms.subscribe)},
        }
        if perms.allow_responses:
            entry["permissions"]["allow_responses"] = True
    return entry


def _q(text: str) -> str:
    return json.dumps(text)


def _j(value: object) -> str:
    return json.dumps(value, indent=2)
