"""The agents the integration tests ask as, added as `intentroute agent add` adds them
(a row in `agents` with the bcrypt hash of a fresh secret, and, with auth on, a NATS
user once the stack's auth sync has reloaded the server)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path

import nats
from nats.aio.client import Client

from shared.auth.natsconn import Credential
from shared.store.agents import AgentStore

# "tests" is trusted: it declares query types. The others are ordinary agents.
TEST_AGENTS = {"tests": True, "agent-a": False, "agent-b": False, "grpc": False,
               "untrusted": False}


async def add_test_agents(nats_url: str, database_url: str) -> dict[str, Credential]:
    return await add_agents(nats_url, database_url, TEST_AGENTS)


async def add_agents(nats_url: str, database_url: str,
                     agents: dict[str, bool]) -> dict[str, Credential]:
    """Agents (id -> trusted) with fresh credentials, admitted by the server."""
    store = await AgentStore.connect(database_url)
    try:
        creds = {}
        for agent, trusted in agents.items():
            if await store.get(agent) is not None:  # a reused external database
                creds[agent] = await store.rotate(agent)
                await store.set_trusted(agent, trusted)
            else:
                creds[agent] = await store.add(agent, trusted=trusted)
    finally:
        await store.close()
    home = os.environ.get("INTENTROUTE_HOME", "")
    if home and (Path(home) / "nats").exists():
        from intentroute.stack.nats_users import sync_agents

        await sync_agents(Path(home), database_url)
        for cred in creds.values():
            await wait_admitted(nats_url, cred)
    return creds


async def wait_admitted(nats_url: str, cred: Credential, timeout: float = 10.0) -> None:
    """Until the server has applied the reload that adds this agent."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            nc = await nats.connect(nats_url, **cred.nats, allow_reconnect=False,
                                    max_reconnect_attempts=0)
            await nc.close()
            return
        except Exception:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.1)


class Connections:
    """`await connect(agent_id)`: a NATS connection with that agent's credential; every
    one opened is drained by `close()` (a fixture's teardown)."""

    def __init__(self, nats_url: str, creds: Mapping[str, Credential]) -> None:
        self.nats_url = nats_url
        self.creds = creds
        self.opened: list[Client] = []

    async def __call__(self, agent_id: str) -> Client:
        client = await nats.connect(self.nats_url, **self.creds[agent_id].nats)
        self.opened.append(client)
        return client

    async def close(self) -> None:
        for client in self.opened:
            await client.drain()
