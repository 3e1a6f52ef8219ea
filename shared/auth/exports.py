"""An agent's credential in the forms other NATS clients read (`intentroute agent add
NAME --format ...`):

* `json`: the credential file itself (`shared.auth.natsconn.Credential`);
* `nats-context`: the official NATS CLI's context, every key as `nats context save`
  writes it (nats-io/jsm.go `natscontext`): save it as
  `~/.config/nats/context/<name>.json` and `nats --context <name> ...` connects as the
  agent, inbox prefix included;
* `env`: `NAME=value` lines of the variables the tools read: `NATS_URL`, `NATS_USER`,
  `NATS_PASSWORD` (the NATS CLI and intentroute's settings), `NATS_INBOX_PREFIX`
  (intentroute's settings; the NATS CLI reads the prefix only from a context), and with
  TLS `NATS_CA` (the NATS CLI) and `NATS_TLS_CA` (intentroute). Values are quoted for a
  POSIX shell only when they need it (generated secrets and URLs never do), so the file
  is also a `docker run --env-file`.
"""

from __future__ import annotations

import enum
import shlex

import msgspec

from shared.auth.natsconn import Credential


class CredentialFormat(enum.StrEnum):
    JSON = "json"
    NATS_CONTEXT = "nats-context"
    ENV = "env"


def nats_context(cred: Credential) -> dict[str, str | bool]:
    """The NATS CLI context of `cred`'s user: the keys `nats context save` writes, in its
    order, "" where the credential has nothing to say."""
    nats = cred.nats
    return {
        "description": f"intentroute agent {cred.agent_id}",
        "url": cred.url,
        "socks_proxy": "",
        "token": "",
        "user": nats.get("user", ""),
        "password": nats.get("password", ""),
        "creds": "",
        "nkey": "",
        "cert": "",
        "key": "",
        "ca": cred.ca,
        "nsc": "",
        "jetstream_domain": "",
        "jetstream_api_prefix": "",
        "jetstream_event_prefix": "",
        "inbox_prefix": nats.get("inbox_prefix", ""),
        "user_jwt": "",
        "color_scheme": "",
        "tls_first": False,
    }


def env_vars(cred: Credential) -> dict[str, str]:
    """The environment that connects as `cred`'s user (the module's `env` form)."""
    nats = cred.nats
    found = {"NATS_URL": cred.url, "NATS_USER": nats.get("user", ""),
             "NATS_PASSWORD": nats.get("password", ""),
             "NATS_INBOX_PREFIX": nats.get("inbox_prefix", ""),
             "NATS_CA": cred.ca, "NATS_TLS_CA": cred.ca}
    return {name: value for name, value in found.items() if value}


def render(cred: Credential, form: CredentialFormat) -> str:
    """`cred` as the text of a file in `form` (ending in a newline)."""
    if form is CredentialFormat.NATS_CONTEXT:
        text = msgspec.json.format(msgspec.json.encode(nats_context(cred)), indent=2).decode()
    elif form is CredentialFormat.ENV:
        text = "\n".join(f"{name}={shlex.quote(value)}"
                         for name, value in env_vars(cred).items())
    else:
        text = msgspec.json.format(msgspec.json.encode(cred)).decode()
    return f"{text}\n"
