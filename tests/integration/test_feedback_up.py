"""`intentroute up` serves the doors' HTTP face and names it in `stack.json`, the way
other tools find it: `POST {gateway_http_url}/agents/{agent_id}/feedback` with the token
of the agent's credential file. Two doors replicas share the one port. With `--grpc`
the gRPC face too, at `gateway_grpc_address`: health SERVING (grpcio's health stub) and
reflection listing the service; the demo credential names the NATS server. Metrics are on
by default: `metrics_port` in `stack.json` serves the first worker's, and the scrape
targets file lists every worker process on the next ports."""

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
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from intentroute.stack.nats_users import DEMO_AGENT, auth_files
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


async def _serving(address: str) -> str:
    """The doors' health status over gRPC ("" while nothing answers yet)."""
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=2)
        except grpc.aio.AioRpcError:
            return ""
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return name if name == "SERVING" else ""


def _reflected_services(address: str) -> list[str]:
    with grpc.insecure_channel(address) as channel:
        return list(ProtoReflectionDescriptorDatabase(channel).get_services())


@pytest.mark.timeout(300)
async def test_up_writes_the_gateway_http_url_and_grpc_address_and_serves_them(
    tmp_path: Path, kb_index: Path
) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NATS_", "DATABASE_URL", "GATEWAY_", "INTENTROUTE_"))}
    env.update(INTENTROUTE_HOME=str(home), INDEX_DIR=str(kb_index), HF_HUB_OFFLINE="1",
               LOG_LEVEL="WARNING", GENERATOR_BACKEND="extractive", AVAP_PARSER_TIMEOUT="0")
    log = (tmp_path / "up.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "intentroute.cli", "up", "--replicas", "doors=2", "--grpc",
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
        grpc_address = state.gateway_grpc_address
        health = await _wait_for(lambda: _serving(grpc_address), proc, 120)
        services = await asyncio.to_thread(_reflected_services, grpc_address)
        metrics_url = f"http://127.0.0.1:{state.metrics_port}/metrics"
        async with aiohttp.ClientSession() as http:
            async def scraped() -> str:
                try:
                    async with http.get(metrics_url) as resp:
                        text = await resp.text()
                except aiohttp.ClientConnectionError:
                    return ""
                return text if "intentroute_stage_inflight{" in text else ""

            metrics = str(await _wait_for(scraped, proc, 120))
        # Read while `up` runs: it removes the file when it stops.
        targets = json.loads(await asyncio.to_thread(Path(state.metrics_targets).read_text))
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
    assert grpc_address.startswith("127.0.0.1:")
    assert health == "SERVING"
    assert "intentroute.agent.v1.AssistanceEngine" in services
    assert json.loads(auth_files(home).credential(DEMO_AGENT).read_text())["url"] == (
        state.nats_url)
    assert (await asyncio.to_thread(token_file.stat)).st_mode & 0o077 == 0
    assert 'intentroute_stage_inflight{stage="gateway"}' in metrics
    assert [(t["labels"]["worker"], t["targets"]) for t in targets] == [
        (worker, [f"127.0.0.1:{state.metrics_port + i}"]) for i, worker in enumerate(
            ("gateway", "classifier", "retriever", "generator-main",
             "generator-conversational", "validator", "doors", "doors"))]
    # Neither doors replica died on the shared port.
    assert "doors (pid" not in output, output[-3000:]
