"""`intentroute up` serves the gateway's HTTP face and names it in `stack.json`, the way
other tools find it: `POST {gateway_http_url}/agents/{agent_id}/feedback` with the token
of the agent's credential file. Two gateway replicas share the one port."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import aiohttp
import pytest

from intentroute.stack.auth import DEMO_AGENT, auth_files
from intentroute.stack.state import read_state

pytestmark = pytest.mark.integration


async def _wait_for(check, proc, timeout: float) -> object:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = await check()
        if result:
            return result
        assert proc.returncode is None, f"`intentroute up` exited with {proc.returncode}"
        if loop.time() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.1)


@pytest.mark.timeout(300)
async def test_up_writes_the_gateway_http_url_and_serves_feedback_there(
    tmp_path: Path, kb_index: Path
) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NATS_", "DATABASE_URL", "GATEWAY_", "INTENTROUTE_"))}
    env.update(INTENTROUTE_HOME=str(home), INDEX_DIR=str(kb_index), HF_HUB_OFFLINE="1",
               LOG_LEVEL="WARNING", GENERATOR_BACKEND="extractive", AVAP_PARSER_TIMEOUT="0")
    log = (tmp_path / "up.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "intentroute.cli", "up", "--replicas", "gateway=2",
        env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    statuses: dict[str, int] = {}
    try:
        async def stack_url() -> str:
            state = read_state(home) if (home / "stack.json").exists() else None
            return state.gateway_http_url if state else ""

        url = str(await _wait_for(stack_url, proc, 120))
        token = json.loads(auth_files(home).credential(DEMO_AGENT).read_text())["token"]
        feedback = f"{url}/agents/{DEMO_AGENT}/feedback"
        body = {"request_id": uuid.uuid4().hex, "outcome": "success"}
        async with aiohttp.ClientSession() as http:
            async def served() -> int:
                try:
                    async with http.post(feedback, json=body, headers={
                            "Authorization": f"Bearer {token}"}) as resp:
                        return resp.status
                except aiohttp.ClientConnectionError:
                    return 0

            statuses["unknown request"] = int(await _wait_for(served, proc, 120))  # type: ignore[call-overload]
            # New connections each time: with two replicas on the port, both answer.
            for i in range(6):
                async with aiohttp.ClientSession() as fresh, fresh.post(
                        feedback, json=body, headers={"Authorization": "Bearer demo.wrong"}
                ) as resp:
                    statuses[f"bad token {i}"] = resp.status
            # The operator dashboard is on, behind the token `up` generated.
            state = read_state(home)
            assert state is not None
            token_file = Path(state.dashboard_token_file)
            board_token = (await asyncio.to_thread(token_file.read_text)).strip()
            api = f"{state.dashboard_url}/api/data"
            async with http.get(api, headers={"Authorization": f"Bearer {board_token}"}) as r:
                statuses["dashboard"] = r.status
            async with http.get(api, headers={"Authorization": f"Bearer {token}"}) as r:
                statuses["dashboard, agent token"] = r.status
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 60)
        log.close()
    output = (tmp_path / "up.log").read_text(errors="replace")
    assert url.startswith("http://127.0.0.1:")
    assert statuses == {"unknown request": 404, **{f"bad token {i}": 401 for i in range(6)},
                        "dashboard": 200, "dashboard, agent token": 401}
    assert state.dashboard_url == f"{url}/dashboard"
    assert (await asyncio.to_thread(token_file.stat)).st_mode & 0o077 == 0
    # Neither gateway replica died on the shared port.
    assert "gateway (pid" not in output, output[-3000:]
