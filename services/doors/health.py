"""`GET /healthz` and `GET /readyz` on the doors' HTTP server, for probes (no token).

* `/healthz`: 200 while the process serves HTTP at all (a liveness probe);
* `/readyz`: 200 when this replica can answer: its NATS connection is up, Postgres
  (the agents' tokens) answers `SELECT 1` within `timeout`, and it is serving (from the
  end of its start-up to the start of its shutdown: the check keeps the name
  `consumers` it had when the doors were the gateway's); else 503. Both bodies name
  each check:
  `{"status": "ready", "checks": {"nats": "ok", "postgres": "ok", "consumers": "ok"}}`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import asyncpg
from aiohttp import web
from nats.aio.client import Client

HEALTH_PATH = "/healthz"
READY_PATH = "/readyz"
OK = "ok"


class Readiness:
    def __init__(self, nc: Client, pool: asyncpg.Pool, consuming: Callable[[], bool], *,
                 timeout: float = 1.0) -> None:
        self._nc = nc
        self._pool = pool
        self._consuming = consuming
        self._timeout = timeout

    async def _postgres(self) -> str:
        try:
            async with asyncio.timeout(self._timeout):
                await self._pool.fetchval("SELECT 1")
        except TimeoutError:
            return f"no answer within {self._timeout:g} s"
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            return f"unreachable: {type(exc).__name__}"
        return OK

    async def checks(self) -> dict[str, str]:
        return {"nats": OK if self._nc.is_connected else "not connected",
                "postgres": await self._postgres(),
                "consumers": OK if self._consuming() else "not pulling"}

    async def ready(self) -> bool:
        """Every check ok (gRPC's health service follows this)."""
        return all(value == OK for value in (await self.checks()).values())


READINESS_KEY = web.AppKey("readiness", Readiness)


def add_health_routes(app: web.Application, readiness: Readiness) -> None:
    app[READINESS_KEY] = readiness
    app.router.add_get(HEALTH_PATH, healthz)
    app.router.add_get(READY_PATH, readyz)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    checks = await request.app[READINESS_KEY].checks()
    ready = all(value == OK for value in checks.values())
    return web.json_response({"status": "ready" if ready else "not ready", "checks": checks},
                             status=200 if ready else 503)
