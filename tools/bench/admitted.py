"""Waiting for a benchmark's agents to be admitted by NATS: `sync_agents` asks the server
to reload its accounts, which it applies a moment later (a node at a time in a cluster)."""

from __future__ import annotations

import asyncio
from typing import Any

import nats

# Tries a node, 0.05 s apart: 5 s, far more than a reload takes here.
TRIES = 100


async def until_admitted(servers: list[str], credential: dict[str, Any]) -> None:
    """Until every node in `servers` accepts a connection with `credential` (or each has
    been tried TRIES times: the benchmark then fails on its first request, saying why)."""
    for server in servers:
        for _ in range(TRIES):
            try:
                await (await nats.connect(server, **credential,
                                          max_reconnect_attempts=0)).close()
                break
            except Exception:
                await asyncio.sleep(0.05)
