"""`intentroute agent add|revoke` change the running nats-server or say why not: after a
restart of the server they find its current process (stack.json still names the old
pid), and when the server refuses the reload they exit 1 with its reason, leaving no
half-made agent (no row, no credential file), so a rerun succeeds."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import nats
import pytest

from intentroute.stack import NatsServer, PostgresServer, StackInfo, write_state
from intentroute.stack.nats_users import auth_files
from shared.auth.natsconn import read_credential
from shared.store import migrate
from shared.store.agents import AgentStore

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent.parent


class Stack(NamedTuple):
    state_dir: Path
    nats: NatsServer
    pg: PostgresServer


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    state = tmp_path_factory.mktemp("reload")
    nats_server = NatsServer(state / "nats", creds_dir=auth_files(state).creds_dir).start()
    pg = PostgresServer(state / "postgres").start()
    try:
        migrate(pg.url)
        # What `up` leaves for the other commands: its pid (alive: this process) and
        # the server's pid at the time.
        write_state(state, StackInfo(
            nats_url=nats_server.url, database_url=pg.url, pid=os.getpid(),
            nats_config=str(auth_files(state).config), nats_pid=nats_server.pid,
            nats_pids=[nats_server.pid]))
        yield Stack(state, nats_server, pg)
    finally:
        nats_server.stop()
        pg.stop()


def cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "DATABASE_URL")}
    env.update(INTENTROUTE_HOME=str(stack.state_dir), PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "intentroute.cli", *args], env=env,
                          capture_output=True, text=True, timeout=60)


async def run_cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(cli, stack, *args)


async def connects(stack: Stack, cred_file: Path) -> bool:
    try:
        nc = await nats.connect(stack.nats.url, allow_reconnect=False,
                                **read_credential(cred_file).nats)
    except nats.errors.Error:
        return False
    await nc.close()
    return True


async def test_agent_add_after_a_server_restart_reaches_the_new_process(
        stack: Stack, tmp_path: Path) -> None:
    old_pid = stack.nats.pid
    await asyncio.to_thread(stack.nats.stop)
    await asyncio.to_thread(stack.nats.start)  # same port, data and config; a new pid
    assert stack.nats.pid != old_pid
    out = tmp_path / "rita.json"
    res = await run_cli(stack, "agent", "add", "rita", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert await connects(stack, out)  # the reload happened, confirmed before exit 0


async def test_a_refused_reload_fails_the_add_and_leaves_no_agent(
        stack: Stack, tmp_path: Path) -> None:
    config = auth_files(stack.state_dir).config
    good = config.read_text()
    # A change nats-server cannot apply on reload (what a second `up` once did).
    config.write_text(good.replace(str(stack.nats.port), str(stack.nats.port + 1)))
    out = tmp_path / "sam.json"
    try:
        res = await run_cli(stack, "agent", "add", "sam", "--out", str(out))
        assert res.returncode == 1, res.stdout + res.stderr
        assert "refused the reload" in res.stderr, res.stderr
        assert "Port" in res.stderr, res.stderr  # the server's own reason
        assert "Traceback" not in res.stderr
        assert "added" not in res.stderr.replace("not added", "")
        assert not out.exists()
        store = await AgentStore.connect(stack.pg.url)
        try:
            assert await store.get("sam") is None
        finally:
            await store.close()
        revoked = await run_cli(stack, "agent", "revoke", "rita")
        assert revoked.returncode == 1
        assert "refused the reload" in revoked.stderr, revoked.stderr
    finally:
        config.write_text(good)
    res = await run_cli(stack, "agent", "add", "sam", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert await connects(stack, out)
