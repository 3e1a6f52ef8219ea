"""How a process connects to NATS: settings or a credential file -> `nats.connect` kwargs.

Workers take their credential from the environment (CommonSettings: NATS_USER +
NATS_PASSWORD, NATS_TOKEN or NATS_CREDS, NATS_TLS_*); callers such as
`intentroute ask` take it from a credential file, a JSON object other tools rely on:

    {"agent_id": "...", "nats": {<nats.connect kwargs besides the URL>}, "token": "..."}

`nats` holds `user`, `password` and `inbox_prefix`; `token` is the bearer credential
for gRPC and HTTP (`<agent_id>.<secret>`), "" for the stack's own service users.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from pathlib import Path
from typing import Any

import msgspec

from shared.common.settings import CommonSettings

# How a caller comes back after its server restarts: nats-py tries a server it lost again
# only every `reconnect_time_wait` (default 2 s, so up to 2 s after the server listens
# again) and gives up after 60 attempts (default). Workers use the same wait
# (shared.runtime.streams.make_broker). nats-py has no jitter: all clients reconnect
# together, which costs the server one cheap hash check each (intentroute.stack.auth).
RECONNECT: dict[str, Any] = {"reconnect_time_wait": 0.25, "max_reconnect_attempts": -1}


class Credential(msgspec.Struct, frozen=True, kw_only=True):
    agent_id: str
    nats: dict[str, str]
    token: str = ""


def inbox_prefix(user: str) -> str:
    """The only reply subjects a user may subscribe to are under this prefix."""
    return f"_INBOX.{user}"


def user_credential(user: str, secret: str, *, token: str = "") -> Credential:
    return Credential(
        agent_id=user,
        nats={"user": user, "password": secret, "inbox_prefix": inbox_prefix(user)},
        token=token,
    )


def write_credential(path: Path, cred: Credential) -> None:
    """Write a credential readable by its owner only (created 0600 by mkstemp, then
    renamed into place; its directory 0700 when this creates it)."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(msgspec.json.format(msgspec.json.encode(cred)) + b"\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_credential(path: Path) -> Credential:
    return msgspec.json.decode(path.read_bytes(), type=Credential)


def tls_context(ca: str, cert: str = "", key: str = "") -> ssl.SSLContext | None:
    """A client TLS context verifying the server against `ca` (the system CAs when only a
    client certificate is given); None when TLS is not configured."""
    if not (ca or cert):
        return None
    ctx = ssl.create_default_context(cafile=ca or None)
    if cert:
        ctx.load_cert_chain(cert, key or None)
    return ctx


def tls_kwargs(common: CommonSettings) -> dict[str, Any]:
    ctx = tls_context(common.nats_tls_ca, common.nats_tls_cert, common.nats_tls_key)
    return {"tls": ctx} if ctx is not None else {}


def connect_kwargs(common: CommonSettings) -> dict[str, Any]:
    """`nats.connect` keyword arguments (besides the URL) from the settings."""
    kwargs: dict[str, Any] = tls_kwargs(common)
    if common.nats_creds:
        kwargs["user_credentials"] = common.nats_creds
    if common.nats_user:
        kwargs["user"] = common.nats_user
        kwargs["password"] = common.nats_password
    if common.nats_token:
        kwargs["token"] = common.nats_token
    if common.inbox_prefix:
        kwargs["inbox_prefix"] = common.inbox_prefix
    return kwargs


def credential_kwargs(cred: Credential, common: CommonSettings) -> dict[str, Any]:
    """`nats.connect` kwargs for a credential file's user, with the settings' TLS."""
    return {**tls_kwargs(common), **cred.nats}
