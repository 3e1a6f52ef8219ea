"""`intentroute up` keeps its servers: nats-server and Postgres killed with SIGKILL are
started again on the same ports with their data, the workers and a caller connected
before the kill come back by themselves, and questions are answered after each; the
next `up` in the same state directory takes the same ports, and one whose remembered
NATS port is taken refuses in one line."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import nats
import pytest

from intentroute.stack.state import StackInfo, pid_alive, read_state
from intentroute.stack.tcp_ports import PORTS_FILE, StackPorts, write_ports
from shared.auth.natsconn import read_credential
from shared.client.caller import follow, publish_until_stored
from shared.contracts.request import AgentRequest
from shared.contracts.response import response_subject
from shared.store import asyncpg_dsn

pytestmark = pytest.mark.integration


def _env(home: Path, kb_index: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NATS_", "DATABASE_", "GATEWAY_", "INTENTROUTE_", "LEARN_",
                                "POSTGRES_"))}
    env.update(INTENTROUTE_HOME=str(home), INDEX_DIR=str(kb_index), HF_HUB_OFFLINE="1",
               LOG_LEVEL="WARNING", GENERATOR_BACKEND="extractive")
    return env


async def _start_up(env: dict[str, str], cwd: Path, log: Path) -> asyncio.subprocess.Process:
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "intentroute.cli", "up", env=env, cwd=cwd, stdout=out,
            stderr=subprocess.STDOUT)


def _tail(log: Path) -> str:
    return log.read_text()[-3000:]


async def _until(check: Any, what: str, proc: asyncio.subprocess.Process, log: Path,
                 timeout: float = 120.0) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        found = check()
        if found:
            return found
        assert proc.returncode is None, _tail(log)
        assert loop.time() < deadline, f"{what}: {_tail(log)}"
        await asyncio.sleep(0.1)


async def _answer(nc: nats.NATS, query: str, timeout: float = 60.0) -> list[Any]:
    """Ask as the demo agent on an existing connection (published until stored, as a
    caller does through a restart); the answer's final chunks."""
    req = AgentRequest(request_id=uuid.uuid4().hex, session_id="restarts", agent_id="demo",
                       query=query, query_type="RETRIEVAL")
    sub = await nc.subscribe(response_subject("demo", req.request_id))
    try:
        await publish_until_stored(nc, req, give_up_at=asyncio.get_running_loop().time()
                                   + timeout)
        return [chunk async for chunk in follow(sub, timeout=timeout) if chunk.is_final]
    finally:
        await sub.unsubscribe()


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 90)


def _restarted(home: Path, before: StackInfo, field: str) -> StackInfo | None:
    """stack.json once it names a new, live pid in `field`."""
    state = read_state(home)
    if state is None:
        return None
    pid = getattr(state, field)
    return state if pid and pid != getattr(before, field) and pid_alive(pid) else None


@pytest.mark.timeout(600)
async def test_up_restarts_killed_servers_on_their_ports_and_keeps_them_next_time(
        tmp_path: Path, kb_index: Path) -> None:
    home, log = tmp_path / "home", tmp_path / "up.log"
    env = _env(home, kb_index)
    proc = await _start_up(env, tmp_path, log)
    try:
        first: StackInfo = await _until(lambda: read_state(home), "stack.json", proc, log)
        assert first.postgres_pid
        assert first.nats_pid
        cred = read_credential(home / "creds" / "demo.json")
        reconnected = asyncio.Event()

        async def on_reconnect() -> None:
            reconnected.set()

        nc = await nats.connect(first.nats_url, **cred.nats, reconnect_time_wait=0.1,
                                max_reconnect_attempts=-1, reconnected_cb=on_reconnect)
        try:
            finals = await _answer(nc, "What is AVAP?", timeout=180)
            assert len(finals) == 1
            assert finals[0].error is None

            os.kill(first.nats_pid, signal.SIGKILL)
            after_nats: StackInfo = await _until(
                lambda: _restarted(home, first, "nats_pid"), "nats-server restarted", proc, log)
            assert after_nats.nats_url == first.nats_url  # the same port
            assert after_nats.nats_pids == [after_nats.nats_pid]
            # The caller connected before the kill reconnects by itself, and is answered.
            await asyncio.wait_for(reconnected.wait(), 30)
            finals = await _answer(nc, "How do I loop in AVAP?")
            assert len(finals) == 1
            assert finals[0].error is None

            os.kill(first.postgres_pid, signal.SIGKILL)
            after_pg: StackInfo = await _until(
                lambda: _restarted(home, after_nats, "postgres_pid"), "postgres restarted",
                proc, log)
            assert after_pg.database_url == first.database_url  # same port, same role
            finals = await _answer(nc, "What does addParam do?")
            assert len(finals) == 1
            assert finals[0].error is None
            # The data survived: the turns asked before the kills are still there.
            conn = await asyncpg.connect(asyncpg_dsn(after_pg.database_url))
            try:
                logged = await conn.fetchval(
                    "SELECT count(*) FROM request_log WHERE agent_id = 'demo'")
            finally:
                await conn.close()
            assert logged >= 3
        finally:
            await nc.close()
        text = log.read_text()
        assert "nats-server restarted" in text
        assert "postgres restarted" in text
    finally:
        await _stop(proc)

    # The next `up` in the same state directory: the same addresses, and it says so.
    proc = await _start_up(env, tmp_path, log)
    try:
        # The banner (with the ports line) follows the new stack.json; the last up's
        # stack.json may still be there, so the line is what says this up is running.
        await _until(lambda: "ports reused from the last up: NATS" in log.read_text(),
                     "the ports line", proc, log)
        again: StackInfo = await _until(lambda: read_state(home), "stack.json again", proc, log)
        assert again.nats_url == first.nats_url
        assert urlsplit(again.database_url).port == urlsplit(first.database_url).port
        assert again.gateway_http_url == first.gateway_http_url
    finally:
        await _stop(proc)


@pytest.mark.timeout(120)
async def test_up_refuses_in_one_line_when_its_remembered_nats_port_is_taken(
        tmp_path: Path, kb_index: Path) -> None:
    home = tmp_path / "home"
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        write_ports(home, StackPorts(nats=[port]))
        done = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "intentroute.cli", "up", env=_env(home, kb_index),
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _, err = await asyncio.wait_for(done.communicate(), 90)
    lines = [line for line in err.decode().splitlines()
             if line.strip() and "Warning" not in line and "user_runtime_dir" not in line]
    assert done.returncode == 2, err.decode()
    assert lines == [f"intentroute up: NATS port {port} (remembered in {home / PORTS_FILE}) "
                     "is in use by another process: stop it, or choose another port with "
                     "--nats-port PORT or NATS_PORT (0: any free port)"]
    assert not (home / "stack.json").exists()
    assert not (home / "postgres").exists()  # nothing started
