"""An agent's NATS connection from its credential file (`intentroute agent add --out
FILE`): the server(s) NATS_URL names when the environment sets it, else those the
credential carries (`url`), else NATS_URL's default; TLS from the NATS_TLS_* settings,
else the credential's CA.

    nc = await connect_agent(Path("bot.json"))
    async for chunk in ask(nc, AgentRequest(...)):
        ...
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client

from shared.auth.natsconn import RECONNECT, Credential, credential_kwargs, read_credential
from shared.common.settings import CommonSettings, is_set, nats_servers


def agent_servers(cred: Credential, environ: Mapping[str, str] | None = None) -> list[str]:
    """Where `cred`'s agent connects: NATS_URL when `environ` (default: the process's)
    sets it, else the credential's `url`, else NATS_URL's default."""
    if cred.url and not is_set(CommonSettings, "nats_url", environ):
        return nats_servers(cred.url)
    return CommonSettings.from_env(environ).nats_servers


async def connect_agent(
    cred: Credential | Path, *, environ: Mapping[str, str] | None = None, **options: Any
) -> Client:
    """A connection as `cred`'s agent (a credential, or its file): `agent_servers`,
    nats-py's reconnects as the CLI's (`RECONNECT`), `options` passed to `nats.connect`
    over those."""
    if isinstance(cred, Path):
        cred = read_credential(cred)
    common = CommonSettings.from_env(environ)
    return await nats.connect(agent_servers(cred, environ),
                              **{**RECONNECT, **credential_kwargs(cred, common), **options})
