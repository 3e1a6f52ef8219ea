"""An embedded stack with auth on, and assertions that the server refused an action.

nats-server answers a forbidden publish or subscribe with an asynchronous
`-ERR 'Permissions Violation ...'` and keeps the connection; nats-py hands it to the
error callback. It does not always arrive before the PONG of the next flush (about one
subscription in three came later, measured), so a refusal is awaited, with a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client

from intentroute.stack import embedded_stack
from intentroute.stack.nats_users import admin_kwargs, auth_files, service_env, sync_agents
from shared.auth.natsconn import Credential
from shared.runtime.streams import ensure_streams
from shared.store import migrate
from shared.store.agents import AgentStore

REFUSAL_WAIT = 3.0


@dataclass
class Recorded:
    """A connection and every error the server sent it."""

    nc: Client
    errors: list[str] = field(default_factory=list)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def refusals(self, since: int = 0) -> list[str]:
        return [e.lower() for e in self.errors[since:] if "permissions violation" in e.lower()]

    async def wait_refusal(self, expected: str, since: int, timeout: float = REFUSAL_WAIT) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not any(expected in e for e in self.refusals(since)):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)
        return True


async def connect_recording(url: str, **kwargs: Any) -> Recorded:
    errors: list[str] = []
    changed, disconnected = asyncio.Event(), asyncio.Event()

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))
        changed.set()

    async def on_disconnect() -> None:
        disconnected.set()

    kwargs.setdefault("allow_reconnect", False)
    nc = await nats.connect(url, error_cb=on_error, disconnected_cb=on_disconnect, **kwargs)
    return Recorded(nc, errors, disconnected, changed)


async def assert_publish_refused(conn: Recorded, subject: str, payload: bytes = b"{}") -> None:
    since = len(conn.errors)
    await conn.nc.publish(subject, payload)
    await conn.nc.flush(timeout=5)
    expected = f'permissions violation for publish to "{subject.lower()}"'
    assert await conn.wait_refusal(expected, since), (subject, conn.errors[since:])


async def assert_subscribe_refused(conn: Recorded, subject: str) -> None:
    since = len(conn.errors)
    sub = await conn.nc.subscribe(subject)
    await conn.nc.flush(timeout=5)
    expected = f'permissions violation for subscription to "{subject.lower()}"'
    assert await conn.wait_refusal(expected, since), (subject, conn.errors[since:])
    await sub.unsubscribe()


async def assert_no_refusal(conn: Recorded, since: int) -> None:
    """Nothing refused since `since` (a late refusal is given a second to show up)."""
    await conn.nc.flush(timeout=5)
    assert not await conn.wait_refusal("permissions violation", since, timeout=1.0), (
        conn.errors[since:]
    )


@dataclass
class AuthStack:
    state_dir: Path
    nats_url: str
    database_url: str
    agents: dict[str, Credential]

    def admin(self) -> dict[str, Any]:
        return admin_kwargs(self.state_dir)

    def service(self, worker: str) -> dict[str, Any]:
        env = service_env(self.state_dir, worker)
        return {"user": env["NATS_USER"], "password": env["NATS_PASSWORD"],
                "inbox_prefix": env["NATS_INBOX_PREFIX"]}

    def agent(self, agent_id: str) -> dict[str, Any]:
        return dict(self.agents[agent_id].nats)

    @property
    def nats_pid(self) -> int:
        from intentroute.stack.nats_users import server_pid

        return server_pid(auth_files(self.state_dir))


async def declare_streams(nats_url: str, admin: dict[str, Any]) -> None:
    """The streams, declared by the admin as `intentroute up` does."""
    nc = await nats.connect(nats_url, **admin)
    try:
        await ensure_streams(nc.jetstream(), 3600)
    finally:
        await nc.drain()


@asynccontextmanager
async def auth_stack(state_dir: Path, agents: tuple[str, ...]) -> AsyncIterator[AuthStack]:
    """Embedded NATS (auth on) + Postgres, migrated, with these agents added and live."""
    with embedded_stack(state_dir) as (nats_url, database_url):
        await asyncio.to_thread(migrate, database_url)  # alembic runs its own loop
        store = await AgentStore.connect(database_url)
        try:
            creds = {agent: await store.add(agent) for agent in agents}
        finally:
            await store.close()
        await sync_agents(state_dir, database_url)
        await declare_streams(nats_url, admin_kwargs(state_dir))
        for cred in creds.values():  # wait for the reload to admit them
            await (await connect_eventually(nats_url, cred.nats)).nc.close()
        yield AuthStack(state_dir, nats_url, database_url, creds)


async def connect_eventually(
    url: str, kwargs: Mapping[str, Any], *, timeout: float = 5.0
) -> Recorded:
    """Connect once the server has applied a reload (SIGHUP returns before it has; a
    TLS handshake during the reload may be reset)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            return await connect_recording(url, **dict(kwargs))
        except (nats.errors.Error, OSError):
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.05)
