"""Feedback -> score lag: seconds from an agent's `POST /agents/{id}/feedback` until its
row in `agent_scores` reflects the verdict (ADR-0006 asks for <= 60 s).

A gateway worker (which records the verdict, with its score refresh at the default
interval unless told otherwise) and a doors worker (the HTTP route) run as processes of
their own on the embedded servers (auth on). The agent has logged
requests (their implicit outcome: success); each sample turns one into `user_rejected`
and polls the agent's success count until it drops. Samples start at random phases of
the refresh interval, so the figures spread over it: the median is about half the
interval plus one refresh, the max about the interval plus one refresh.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from intentroute.stack import embedded_stack, free_port

AGENT = "bench-feedback"
MODEL = "bench-model"
_SQL_SUCCESSES = """
SELECT successes FROM agent_scores WHERE agent_id = $1 AND model = $2 AND query_type = $3
"""


async def measure_lag(
    http_url: str,
    token: str,
    pool: asyncpg.Pool,
    agent: str,
    request_ids: list[str],
    *,
    model: str = MODEL,
    query_type: str = "RETRIEVAL",
    phase: float = 5.0,
    timeout: float = 60.0,
) -> list[float]:
    """One lag per request id (each must be the agent's, logged with `model` and
    `query_type`, its verdict a success so far): rejected over HTTP, then polled every
    20 ms until the agent's success count has dropped. Waits a random 0..`phase` s
    before each, so samples do not lock onto the refresher's ticks."""
    lags: list[float] = []
    async with aiohttp.ClientSession() as http:
        for request_id in request_ids:
            await asyncio.sleep(random.uniform(0, phase))
            before = await pool.fetchval(_SQL_SUCCESSES, agent, model, query_type)
            sent = time.perf_counter()
            async with http.post(f"{http_url}/agents/{agent}/feedback",
                                 headers={"Authorization": f"Bearer {token}"},
                                 json={"request_id": request_id,
                                       "outcome": "user_rejected"}) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"feedback refused: {resp.status} {await resp.text()}")
            while await pool.fetchval(_SQL_SUCCESSES, agent, model, query_type) >= before:
                if time.perf_counter() - sent > timeout:
                    raise TimeoutError(f"score not updated within {timeout}s")
                await asyncio.sleep(0.02)
            lags.append(time.perf_counter() - sent)
    return lags


async def _prepare(state: Path, db_url: str, nats_url: str, samples: int) -> tuple[str, list[str]]:
    """The agent (a NATS user too), its logged requests and their first scores."""
    import nats

    from intentroute.stack.nats_users import admin_kwargs, sync_agents
    from shared.runtime.streams import ensure_streams
    from shared.store.agents import AgentStore
    from shared.store.rows import RequestLogRow
    from shared.store.scores import refresh_scores
    from shared.store.stores import Store

    agents = await AgentStore.connect(db_url)
    try:
        cred = await agents.add(AGENT)
    finally:
        await agents.close()
    await sync_agents(state, db_url)
    async with await nats.connect(nats_url, **admin_kwargs(state)) as admin:
        await ensure_streams(admin.jetstream(), 3600)
    store = await Store.connect(db_url)
    try:
        ids = [uuid.uuid4().hex for _ in range(samples)]
        await store.write(*(RequestLogRow(request_id=r, agent_id=AGENT, session_id="s",
                                          outcome="ok", model=MODEL, query_type="RETRIEVAL")
                            for r in ids))
        async with store.pool.acquire() as conn:
            await refresh_scores(conn, datetime.now(UTC), agents=[AGENT])
    finally:
        await store.close()
    return cred.token, ids


async def _measure(http_url: str, db_url: str, token: str, ids: list[str],
                   refresh: float) -> list[float]:
    async with aiohttp.ClientSession() as http:
        for _ in range(600):  # until the doors serve
            try:
                async with http.post(f"{http_url}/agents/{AGENT}/feedback") as resp:
                    if resp.status == 401:
                        break
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.1)
    from shared.store import asyncpg_dsn

    pool = await asyncpg.create_pool(asyncpg_dsn(db_url), min_size=1, max_size=2)
    assert pool is not None
    try:
        return await measure_lag(http_url, token, pool, AGENT, ids, phase=refresh)
    finally:
        await pool.close()


def run(samples: int = 10, score_refresh: float | None = None) -> dict[str, Any]:
    """`score_refresh`: the gateway's SCORE_REFRESH (None: its default)."""
    from intentroute.stack.nats_users import service_env
    from services.gateway.settings import GatewaySettings
    from shared.store import migrate

    refresh = score_refresh if score_refresh is not None else (
        GatewaySettings.from_env({}).score_refresh)
    with tempfile.TemporaryDirectory(prefix="ir-bench-fb-") as tmp:
        state = Path(tmp)
        with embedded_stack(state) as (nats_url, db_url):
            migrate(db_url)
            token, ids = asyncio.run(_prepare(state, db_url, nats_url, samples))
            port = free_port()
            env = dict(os.environ, NATS_URL=nats_url, DATABASE_URL=db_url,
                       INTENTROUTE_HOME=str(state), LOG_LEVEL="WARNING",
                       GATEWAY_HTTP_LISTEN=f"127.0.0.1:{port}", SCORE_REFRESH=str(refresh))
            # The doors take the HTTP verdict and publish it; the gateway records it.
            procs = [subprocess.Popen([sys.executable, "-m", "intentroute.cli", "worker", name],
                                      env={**env, **service_env(state, name)})
                     for name in ("gateway", "doors")]
            try:
                lags = asyncio.run(_measure(f"http://127.0.0.1:{port}", db_url, token, ids,
                                            refresh))
            finally:
                for proc in procs:
                    proc.terminate()
                for proc in procs:
                    proc.wait(15)
    return {
        "feedback_to_score_s": round(statistics.median(lags), 3),
        "feedback_to_score_s_max": round(max(lags), 3),
        "feedback_to_score_s_min": round(min(lags), 3),
        "samples": len(lags),
        "score_refresh_s": refresh,
    }


if __name__ == "__main__":
    print(json.dumps(run()))
