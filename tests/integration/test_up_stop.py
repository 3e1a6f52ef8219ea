"""How `intentroute up` stops and what it shares: Ctrl-C to its whole process group
(as a terminal sends it) under load drains the workers with the servers still up and
stops the servers last, losing and duplicating nothing; a second `up` in the same state
directory is refused in one line and leaves the first, and its files, alone."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest

from bench.sigint import Finals, Up, _request, sigint_under_load, up_env
from intentroute.stack.nats_users import DEMO_AGENT, auth_files
from intentroute.workers import WORKERS
from shared.auth.natsconn import read_credential
from shared.client.caller import publish_until_stored
from shared.common.settings import nats_servers
from shared.contracts.response import agent_responses

pytestmark = pytest.mark.integration


@pytest.mark.timeout(600)
async def test_ctrl_c_to_the_process_group_drains_and_stops_the_servers_last(
        tmp_path: Path, kb_index: Path) -> None:
    result = await sigint_under_load(tmp_path / "home", kb_index, requests=200)
    print(result)
    # Every request published before the signal: one final, before the exit or from
    # the next `up`, seen live by a caller connected through both.
    assert result["lost"] == 0, result
    assert result["duplicate_finals"] == 0, result
    assert result["answered_once"] == result["sent"], result
    # The workers finished work while the servers were up (not all of it was left),
    # and none of them outlived nats-server or Postgres.
    assert result["answered_before_exit"] > 0, result
    assert result["servers_stopped_last"], result
    assert result["exit_code"] == 0, result
    assert result["tracebacks"] == 0, (tmp_path / "home-up1.log").read_text()[-4000:]


def _snapshot(home: Path) -> dict[str, tuple[float, bytes]]:
    files = auth_files(home)
    paths = [files.config, files.auth, files.pid_file, home / "stack.json", home / "up.lock",
             home / "ports.json", home / "postgres" / "pgdata" / "postmaster.pid"]
    return {str(p): (p.stat().st_mtime, p.read_bytes()) for p in paths if p.exists()}


@pytest.mark.timeout(600)
async def test_a_second_up_in_the_same_state_dir_is_refused_and_touches_nothing(
        tmp_path: Path, kb_index: Path) -> None:
    home = tmp_path / "home"
    env = up_env(home, kb_index)
    first = Up({**env, "LOG_LEVEL": "INFO"}, tmp_path / "up1.log").start()
    try:
        state = await asyncio.to_thread(first.state)
        cred = read_credential(auth_files(home).credential(DEMO_AGENT))
        nc = await nats.connect(nats_servers(state.nats_url), **cred.nats)
        finals = Finals()
        await nc.subscribe(agent_responses(DEMO_AGENT), cb=finals.on_chunk)

        async def answered() -> bool:
            req = _request(1)
            await publish_until_stored(nc, req, give_up_at=time.monotonic() + 30)
            deadline = time.monotonic() + 180
            while req.request_id not in finals.finals:
                if time.monotonic() > deadline:
                    return False
                await asyncio.sleep(0.05)
            return True

        assert await answered(), first.output()[-2000:]
        # Quiet, useful logs: a start line naming each worker that answered, no
        # FastStream start line, no progress bar (shared/runtime/logs.py).
        log = first.output()
        for worker in WORKERS:  # a stage names its stream; the doors read none
            started = "started: " if worker == "doors" else "started: stream "
            assert f"worker {worker} {started}" in log, log[-3000:]
        assert "FastStream app started" not in log, log[-3000:]
        assert "it/s]" not in log, log[-3000:]
        assert "Loading weights" not in log, log[-3000:]
        before = _snapshot(home)
        assert str(auth_files(home).config) in before
        assert str(home / "stack.json") in before
        second = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "intentroute.cli", "up"], env=env,
            capture_output=True, text=True, timeout=120)
        assert second.returncode == 1, second.stderr
        lines = [ln for ln in second.stderr.splitlines()
                 if ln.strip() and "Warning" not in ln and "user_runtime_dir" not in ln]
        assert len(lines) == 1, second.stderr
        assert f"pid {first.pid}" in lines[0], lines
        assert str(home) in lines[0], lines
        assert _snapshot(home) == before
        # The first keeps answering.
        assert await answered(), first.output()[-2000:]
        await nc.close()
    finally:
        first.stop()
    assert first.proc is not None
    assert first.proc.returncode == 0, first.output()[-3000:]
