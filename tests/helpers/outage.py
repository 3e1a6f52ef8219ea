"""A stack of the tests' own whose servers can be stopped and started again: nats-server
(auth on) and PostgreSQL on fixed ports, migrated, with one trusted agent and the
streams declared, as `intentroute up` leaves them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats

from intentroute.stack import NatsServer, PostgresServer
from intentroute.stack.nats_users import admin_kwargs, auth_files, sync_agents
from shared.auth.natsconn import Credential
from shared.store import migrate
from shared.store.agents import AgentStore
from tests.helpers.agents import wait_admitted
from tests.helpers.nats_auth import declare_streams

AGENT = "outage-agent"


@dataclass
class OwnStack:
    state_dir: Path
    nats: NatsServer
    pg: PostgresServer
    agent: Credential

    @property
    def nats_url(self) -> str:
        return self.nats.url

    @property
    def database_url(self) -> str:
        return self.pg.url

    def admin(self) -> dict[str, Any]:
        return admin_kwargs(self.state_dir)

    async def connect_agent(self, **extra: Any) -> Any:
        return await nats.connect(self.nats_url, **self.agent.nats,
                                  reconnect_time_wait=0.1, max_reconnect_attempts=-1, **extra)


@asynccontextmanager
async def own_stack(state_dir: Path) -> AsyncIterator[OwnStack]:
    nats_server = NatsServer(state_dir / "nats", creds_dir=auth_files(state_dir).creds_dir)
    pg = PostgresServer(state_dir / "postgres")
    nats_server.start()
    pg.start()
    try:
        await asyncio.to_thread(migrate, pg.url)
        store = await AgentStore.connect(pg.url)
        try:
            cred = await store.add(AGENT, trusted=True)
        finally:
            await store.close()
        await sync_agents(state_dir, pg.url)
        await wait_admitted(nats_server.url, cred)
        await declare_streams(nats_server.url, admin_kwargs(state_dir))
        yield OwnStack(state_dir, nats_server, pg, cred)
    finally:
        nats_server.stop()
        pg.stop()
