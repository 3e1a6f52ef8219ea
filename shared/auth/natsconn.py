"""How a process connects to NATS: settings or a credential file -> `nats.connect` kwargs.

Workers take their credential from the environment (CommonSettings: NATS_USER +
NATS_PASSWORD, NATS_TOKEN or NATS_CREDS, NATS_TLS_*); callers such as
`intentroute ask` take it from a credential file, a JSON object other tools rely on:

    {"agent_id": "...", "nats": {<nats.connect kwargs besides the URL>}, "token": "...",
     "url": "nats://...", "ca": "", "ca_pem": ""}

`nats` holds `user`, `password` and `inbox_prefix`; `token` is the bearer credential
for gRPC and HTTP (`<agent_id>.<secret>`), "" for the stack's own service users. `url`
names the server(s) (NATS_URL's form: one URL or a comma-separated list), and with TLS
`ca` / `ca_pem` the CA that signs their certificates (its path where the credential was
made, and its PEM for a client elsewhere); all three "" when unknown (files written
before they existed). `shared.auth.exports` renders a credential for other clients.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec

from shared.common.settings import CommonSettings, nats_servers

# How a caller comes back after its server restarts: nats-py tries a server it lost again
# only every `reconnect_time_wait` (default 2 s, so up to 2 s after the server listens
# again) and gives up after 60 attempts (default). Workers use the same wait
# (shared.runtime.streams.make_broker). nats-py has no jitter: all clients reconnect
# together, which costs the server one cheap hash check each (intentroute.stack.nats_users).
RECONNECT: dict[str, Any] = {"reconnect_time_wait": 0.25, "max_reconnect_attempts": -1}


class Credential(msgspec.Struct, frozen=True, kw_only=True):
    agent_id: str
    nats: dict[str, str]
    token: str = ""
    url: str = ""
    ca: str = ""
    ca_pem: str = ""


def inbox_prefix(user: str) -> str:
    """The only reply subjects a user may subscribe to are under this prefix."""
    return f"_INBOX.{user}"


def user_credential(user: str, secret: str, *, token: str = "") -> Credential:
    return Credential(
        agent_id=user,
        nats={"user": user, "password": secret, "inbox_prefix": inbox_prefix(user)},
        token=token,
    )


def public_url(url: str) -> str:
    """A NATS_URL without any `user:password@` its URLs carry (a credential names its
    own user; another's secret must not travel with it)."""
    return ",".join(_without_userinfo(part) for part in nats_servers(url))


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


def with_server(cred: Credential, url: str, ca: str = "") -> Credential:
    """`cred` naming the server(s) to connect to and, with TLS, the CA file that signs
    their certificates (its path and its PEM). OSError when `ca` cannot be read."""
    pem = Path(ca).read_text(encoding="utf-8") if ca else ""
    return msgspec.structs.replace(cred, url=public_url(url), ca=ca, ca_pem=pem)


def write_credential(path: Path, cred: Credential) -> None:
    """Write a credential readable by its owner only."""
    write_secret(path, msgspec.json.format(msgspec.json.encode(cred)) + b"\n")


def write_secret(path: Path, data: bytes) -> None:
    """Write a file readable by its owner only (created 0600 by mkstemp, then renamed
    into place; its directory 0700 when this creates it)."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
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


def credential_tls(cred: Credential) -> ssl.SSLContext | None:
    """A client TLS context trusting the credential's CA (its file when it is there,
    else its PEM); None when the credential names none."""
    if cred.ca and Path(cred.ca).is_file():
        return tls_context(cred.ca)
    return ssl.create_default_context(cadata=cred.ca_pem) if cred.ca_pem else None


def credential_kwargs(cred: Credential, common: CommonSettings) -> dict[str, Any]:
    """`nats.connect` kwargs for a credential file's user, with the settings' TLS (else
    the credential's CA)."""
    kwargs = tls_kwargs(common)
    if not kwargs and (ctx := credential_tls(cred)) is not None:
        kwargs = {"tls": ctx}
    return {**kwargs, **cred.nats}
