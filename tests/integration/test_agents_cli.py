"""`intentroute agent add|list|revoke` against a running embedded stack (auth on), as a
user runs them; and the agents table as the store and the stack's auth sync see it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import nats
import pytest

from intentroute.stack import StackInfo, write_state
from intentroute.stack.auth import AuthSync, auth_files
from shared.auth.natsconn import read_credential
from shared.store import asyncpg_dsn
from shared.store.agents import AgentExistsError, AgentStore, InvalidAgentIdError, UnknownAgentError
from tests.helpers.nats_auth import AuthStack, auth_stack, connect_eventually, connect_recording

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent.parent
# Issue 12: a revoked agent's connections are refused within 10 s.
REVOCATION_BOUND = 10.0


@pytest.fixture(scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[AuthStack]:
    async with auth_stack(tmp_path_factory.mktemp("agents"), ()) as running:
        # What `intentroute up` leaves for the other commands.
        files = auth_files(running.state_dir)
        write_state(running.state_dir, StackInfo(
            nats_url=running.nats_url, database_url=running.database_url, pid=os.getpid(),
            nats_config=str(files.config), nats_pid=running.nats_pid))
        yield running


def cli(stack: AuthStack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "DATABASE_URL")}
    env.update(INTENTROUTE_HOME=str(stack.state_dir), PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "intentroute.cli", *args], env=env,
                          capture_output=True, text=True, timeout=60)


async def run_cli(stack: AuthStack, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(cli, stack, *args)


async def test_agent_add_writes_a_private_credential_that_connects(
    stack: AuthStack, tmp_path: Path
) -> None:
    out = tmp_path / "carol.json"
    res = await run_cli(stack, "agent", "add", "carol", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert out.stat().st_mode & 0o777 == 0o600
    data = json.loads(out.read_text())
    assert set(data) == {"agent_id", "nats", "token"}
    assert data["agent_id"] == "carol"
    assert data["nats"] == {"user": "carol", "password": data["nats"]["password"],
                            "inbox_prefix": "_INBOX.carol"}
    assert data["token"] == f"carol.{data['nats']['password']}"
    assert data["nats"]["password"] not in res.stdout + res.stderr  # shown once: in the file
    conn = await connect_recording(stack.nats_url, **read_credential(out).nats)
    assert conn.nc.is_connected
    await conn.nc.close()


async def test_agent_add_prints_the_credential_once(stack: AuthStack) -> None:
    res = await run_cli(stack, "agent", "add", "dave", "--trusted")
    assert res.returncode == 0, res.stderr
    cred = json.loads(res.stdout)
    conn = await connect_recording(stack.nats_url, **cred["nats"])
    await conn.nc.close()
    listed = json.loads((await run_cli(stack, "agent", "list", "--json")).stdout)
    dave = next(a for a in listed if a["agent_id"] == "dave")
    assert dave["trusted"] is True
    assert dave["revoked_at"] is None
    table = (await run_cli(stack, "agent", "list")).stdout.splitlines()
    assert table[0].split() == ["AGENT", "TRUSTED", "CREATED", "REVOKED"]
    assert any(line.split()[:2] == ["dave", "yes"] for line in table[1:])


@pytest.mark.parametrize(
    ("name", "message"),
    [("admin", "reserved"), ("intentroute-gateway", "reserved"), ("IntentRoute", "reserved"),
     ("a.b", "1 to 64"), ("a b", "1 to 64"), ("x" * 65, "1 to 64"), ("a*", "1 to 64")],
)
async def test_agent_add_refuses_reserved_and_malformed_names(
    stack: AuthStack, name: str, message: str
) -> None:
    res = await run_cli(stack, "agent", "add", name)
    assert res.returncode == 1, res.stderr
    assert message in res.stderr


async def test_agent_add_refuses_an_existing_agent(stack: AuthStack) -> None:
    assert (await run_cli(stack, "agent", "add", "erin")).returncode == 0
    res = await run_cli(stack, "agent", "add", "erin")
    assert res.returncode == 1
    assert "exists" in res.stderr


async def test_a_revoked_agent_is_disconnected_and_refused_within_10s(stack: AuthStack) -> None:
    cred = json.loads((await run_cli(stack, "agent", "add", "frank")).stdout)
    conn = await connect_recording(stack.nats_url, allow_reconnect=True,
                                   reconnect_time_wait=0.2, max_reconnect_attempts=-1,
                                   **cred["nats"])
    started = time.monotonic()
    res = await run_cli(stack, "agent", "revoke", "frank")
    assert res.returncode == 0, res.stderr
    await asyncio.wait_for(conn.disconnected.wait(), REVOCATION_BOUND)
    elapsed = time.monotonic() - started
    assert elapsed < REVOCATION_BOUND
    # Its reconnects are refused, and so is a new connection.
    await asyncio.sleep(1.0)
    assert not conn.nc.is_connected
    assert any("authorization violation" in e.lower() for e in conn.errors)
    await conn.nc.close()
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(stack.nats_url, allow_reconnect=False, **cred["nats"])
    listed = json.loads((await run_cli(stack, "agent", "list", "--json")).stdout)
    assert next(a for a in listed if a["agent_id"] == "frank")["revoked_at"]
    print(f"revoked by the CLI: disconnected {elapsed:.2f}s after `agent revoke` started")


async def test_unknown_agent_revoke_fails(stack: AuthStack) -> None:
    res = await run_cli(stack, "agent", "revoke", "nobody")
    assert res.returncode == 1
    assert "no agent" in res.stderr


async def test_an_agent_revoked_by_sql_is_refused_within_10s(stack: AuthStack) -> None:
    """The stack's auth sync notices a change made behind the CLI's back."""
    store = await AgentStore.connect(stack.database_url)
    sync = AuthSync(stack.state_dir, stack.database_url, pid=stack.nats_pid).start()
    try:
        cred = await store.add("gina")
        conn = await connect_eventually(stack.nats_url, cred.nats)  # the sync adds her
        db = await asyncpg.connect(asyncpg_dsn(stack.database_url))
        started = time.monotonic()
        await db.execute("UPDATE agents SET revoked_at = now() WHERE agent_id = 'gina'")
        await db.close()
        await asyncio.wait_for(conn.disconnected.wait(), REVOCATION_BOUND)
        elapsed = time.monotonic() - started
        assert elapsed < REVOCATION_BOUND
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(stack.nats_url, allow_reconnect=False, **cred.nats)
        print(f"revoked by SQL: disconnected {elapsed:.2f}s later")
    finally:
        await asyncio.to_thread(sync.stop)
        await store.close()


async def test_adding_an_agent_keeps_the_other_connections(stack: AuthStack) -> None:
    """A reload that adds a user leaves the workers' and agents' connections alone."""
    worker = await connect_recording(stack.nats_url, **stack.service("classifier"))
    assert (await run_cli(stack, "agent", "add", "hank")).returncode == 0
    await asyncio.sleep(0.5)
    assert worker.nc.is_connected
    assert not worker.disconnected.is_set()
    await worker.nc.close()


async def test_the_store_checks_bearer_tokens(stack: AuthStack) -> None:
    store = await AgentStore.connect(stack.database_url)
    try:
        cred = await store.add("ivan")
        record = await store.verify_token(cred.token)
        assert record is not None
        assert record.agent_id == "ivan"
        assert not record.trusted
        agent_id, _, secret = cred.token.partition(".")
        for wrong in (f"{agent_id}.x{secret}", f"nobody.{secret}", secret, "", "ivan.",
                      f"ivan.{'a' * 100}", f"admin.{secret}"):
            assert await store.verify_token(wrong) is None, wrong
        rotated = await store.rotate("ivan")
        assert await store.verify_token(cred.token) is None
        assert await store.verify_token(rotated.token) is not None
        assert (await store.set_trusted("ivan", True)).trusted
        before = await store.digest()
        first = await store.revoke("ivan")
        assert await store.digest() != before
        assert await store.verify_token(rotated.token) is None
        assert (await store.revoke("ivan")).revoked_at == first.revoked_at
        assert ("ivan", ) not in [(a,) for a, _ in await store.active_hashes()]
        assert (await store.get("ivan")) is not None  # the row stays
        with pytest.raises(AgentExistsError):
            await store.add("ivan")
        with pytest.raises(InvalidAgentIdError):
            await store.add("intentroute")
        with pytest.raises(UnknownAgentError):
            await store.revoke("nobody")
        with pytest.raises(UnknownAgentError):
            await store.rotate("ivan")
    finally:
        await store.close()
