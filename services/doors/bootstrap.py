"""The doors' composition root in small steps (as cosmicpython's bootstrap): each opens
one thing from the settings, registers what closes it on the worker's exit stack (closed
in reverse order: the servers first, the pools last) and returns it. `app.py` calls them
in order."""

from __future__ import annotations

from contextlib import AsyncExitStack

import asyncpg
from aiohttp import web

from services.doors.dashboard import add_dashboard_routes
from services.doors.door import Door
from services.doors.grpc_server import start_grpc
from services.doors.health import Readiness, add_health_routes
from services.doors.http import build_http_app, start_http
from services.doors.openai_door.routes import add_openai_routes
from services.doors.settings import DoorsSettings
from services.doors.throttle import AuthThrottle, BodyBudget
from shared.auth.identity import CachedAgents
from shared.runtime.worker import ClientWiring
from shared.store import asyncpg_dsn
from shared.store.agent_changes import AgentChanges
from shared.store.policy_cache import PolicyCache, open_policy_cache
from shared.store.stores import AgentSecrets

# The services-API endpoint the doors' calls are counted under (`intentroute status`).
ENDPOINT = "doors"


async def open_pool(settings: DoorsSettings, exits: AsyncExitStack, *, min_size: int = 1,
                    max_size: int = 4) -> asyncpg.Pool:
    """A pool of the doors' own role (agents' tokens; readiness's `SELECT 1`)."""
    pool = await asyncpg.create_pool(asyncpg_dsn(settings.common.database_url),
                                     min_size=min_size, max_size=max_size)
    assert pool is not None
    exits.push_async_callback(pool.close)
    return pool


def agent_records(settings: DoorsSettings, pool: asyncpg.Pool,
                  exits: AsyncExitStack) -> CachedAgents:
    """Agents' records for token checks, cached; a revocation pushed by Postgres drops
    the agent's record at once (shared.store.agent_changes)."""
    secrets = AgentSecrets(pool)
    agents = CachedAgents(secrets.agent, save_digest=secrets.save_token_digest,
                          ttl=settings.common.agent_cache_ttl)
    changes = AgentChanges(asyncpg_dsn(settings.common.database_url), agents.forget,
                           agents.forget_all).start()
    exits.push_async_callback(changes.stop)
    return agents


def door(settings: DoorsSettings, wiring: ClientWiring, agents: CachedAgents) -> Door:
    """The pipeline as the doors reach it; one count of wrong credentials per address,
    whichever door they were tried at."""
    throttle = AuthThrottle(settings.auth_failures, settings.auth_hashes)
    return Door(wiring.nc, agents, throttle, answer_timeout=settings.answer_timeout,
                tracer=wiring.tracer, stats=wiring.signals.stage(ENDPOINT))


async def serve_grpc(settings: DoorsSettings, door: Door, readiness: Readiness,
                     exits: AsyncExitStack) -> None:
    """AskAgent / AskAgentStream / Feedback, health and reflection (off without
    GATEWAY_GRPC_LISTEN)."""
    if not settings.grpc_listen:
        return
    server = await start_grpc(door, settings.grpc_listen, tls=settings.tls,
                              ready=readiness.ready)
    exits.push_async_callback(server.stop, 2.0)


async def agent_policies(settings: DoorsSettings, pool: asyncpg.Pool,
                         exits: AsyncExitStack) -> PolicyCache:
    """The agents' policies (which fleet models each may name at the OpenAI door), read
    at start and every POLICY_REFRESH s; the agents' own, not the learning job's A/B
    candidates (which never touch `models=`, and which the doors' role cannot read)."""
    return await open_policy_cache(pool, refresh=settings.common.policy_refresh,
                                   exits=exits, with_candidates=False)


async def serve_http(settings: DoorsSettings, wiring: ClientWiring, door: Door,
                     readiness: Readiness, pool: asyncpg.Pool, exits: AsyncExitStack
                     ) -> None:
    """Feedback, the OpenAI-compatible door, /healthz and /readyz, and the dashboard
    when it has a token (off without GATEWAY_HTTP_LISTEN)."""
    if not settings.http_listen:
        return
    app = build_http_app(door)
    add_openai_routes(app, door, BodyBudget(settings.door_body_rate),
                      await agent_policies(settings, pool, exits))
    add_health_routes(app, readiness)
    await add_dashboard(settings, wiring, door, app, exits)
    runner, _ = await start_http(app, settings.http_listen)
    exits.push_async_callback(runner.cleanup)


async def add_dashboard(settings: DoorsSettings, wiring: ClientWiring, door: Door,
                        app: web.Application, exits: AsyncExitStack) -> None:
    board = settings.dashboard
    if not board.token:
        return
    # Its own small pool: an operator's slow query never holds a connection the token
    # checks wait for.
    pool = await open_pool(settings, exits, min_size=0, max_size=2)
    add_dashboard_routes(app, pool, token=board.token, default_days=board.default_days,
                         max_days=board.max_days, session_ttl=board.session_ttl,
                         throttle=door.throttle, refresh=board.refresh, nc=wiring.nc,
                         login_links=board.login_links)
