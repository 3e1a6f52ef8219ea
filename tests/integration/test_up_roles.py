"""`intentroute up` runs every worker as its own Postgres role with only its stage's
secrets: no process it starts holds the superuser's password, only the gateway holds
the dashboard's token, and a question is answered end to end with the roles. `up` runs
as the README shows, from a folder with the default state directory (`.intentroute`,
relative), and so do `agent add` / `agent revoke` beside it: from that folder, and
through a symlink to it with INTENTROUTE_HOME naming the state directory through the
link (the running nats-server, started with its config's real path, is found either
way)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from intentroute.stack.state import read_state
from shared.store.roles import LEARNER_ROLE, OWNER_ROLE, WORKER_ROLES

pytestmark = pytest.mark.integration


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(p) for p in text]
    return found


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _worker_name(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    words = [a.decode() for a in argv if a]
    return words[words.index("worker") + 1] if "worker" in words else words[-1]


async def _cli(env: dict[str, str], cwd: Path, *args: str) -> tuple[int, str]:
    """An `intentroute` command as a person runs it from `cwd`: (exit code, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "intentroute.cli", *args, env=env, cwd=cwd,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, err.decode()[-2000:]


async def _agent_added_and_revoked(env: dict[str, str], cwd: Path, name: str) -> None:
    """`intentroute agent add NAME --out NAME.json` then `agent revoke NAME`, as the
    README shows them, beside a running `up`: both reach its nats-server."""
    code, err = await _cli(env, cwd, "agent", "add", name, "--out", f"{name}.json")
    assert code == 0, err
    assert (cwd / f"{name}.json").stat().st_mode & 0o777 == 0o600
    code, err = await _cli(env, cwd, "agent", "revoke", name)
    assert code == 0, err


@pytest.mark.timeout(300)
async def test_up_runs_each_worker_as_its_role_with_its_secrets_only(
        tmp_path: Path, kb_index: Path) -> None:
    # A fresh folder and the default state directory, `.intentroute`: relative.
    folder = tmp_path / "app"
    folder.mkdir()
    home = folder / ".intentroute"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NATS_", "DATABASE_", "GATEWAY_", "INTENTROUTE_", "LEARN_"))}
    env.update(INDEX_DIR=str(kb_index), HF_HUB_OFFLINE="1",
               LOG_LEVEL="WARNING", GENERATOR_BACKEND="extractive", LEARN_INTERVAL="3600")
    log = (tmp_path / "up.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "intentroute.cli", "up", env=env, cwd=folder, stdout=log,
        stderr=subprocess.STDOUT)
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 120
        while not ((home / "stack.json").exists() and read_state(home)):
            assert proc.returncode is None, (tmp_path / "up.log").read_text()[-2000:]
            assert loop.time() < deadline, "no stack.json"
            await asyncio.sleep(0.2)
        state = read_state(home)
        assert state is not None
        superuser_password = (home / "postgres" / "password").read_text().strip()
        token_file = home / "creds" / "dashboard.token"
        # Relative to the folder `up` runs in, as its state directory is.
        assert folder / state.dashboard_token_file == token_file
        dashboard_token = token_file.read_text().strip()
        # Operator commands get the owner's URL, never the superuser's.
        assert urlsplit(state.database_url).username == OWNER_ROLE
        envs = {pid: _environ(pid) for pid in _children(proc.pid)}
        seen: dict[str, str] = {}
        for pid, child in envs.items():
            name = _worker_name(pid)
            values = "\0".join(child.values())
            assert superuser_password not in values, name
            if name in (*WORKER_ROLES, "learner"):
                seen[name] = urlsplit(child["DATABASE_URL"]).username or ""
                assert ("GATEWAY_DASHBOARD_TOKEN" in child) == (name == "doors"), name
                assert "LEARN_DATABASE_URL" not in child, name  # its own role is its URL
                # Every stage stamps; the doors and the learner stamp nothing.
                assert bool(child.get("INTENTROUTE_ADMISSION_KEY")) == (
                    name not in ("doors", "learner")), name
            else:  # the parser: no database, no dashboard
                assert "DATABASE_URL" not in child, name
            assert (dashboard_token in values) == (name == "doors"), name
        # LEARN_INTERVAL set: the learner runs, as the learner's role.
        assert seen == {**WORKER_ROLES, "learner": LEARNER_ROLE}
        ask = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "intentroute.cli", "ask", "What is AVAP?", "--json",
            env=env, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await asyncio.wait_for(ask.communicate(), 180)
        assert ask.returncode == 0, err.decode()[-2000:]
        chunks = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
        final = [c for c in chunks if c.get("is_final")]
        assert len(final) == 1, chunks
        assert not final[0].get("error"), final[0]
        # The agent commands beside it, from the folder (no INTENTROUTE_HOME) ...
        await _agent_added_and_revoked(env, folder, "myapp")
        # ... and through a symlink to it, INTENTROUTE_HOME naming the state directory
        # through the link.
        link = tmp_path / "link"
        link.symlink_to(folder, target_is_directory=True)
        await _agent_added_and_revoked(
            {**env, "INTENTROUTE_HOME": str(link / ".intentroute")}, link, "myapp2")
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 60)
        log.close()
