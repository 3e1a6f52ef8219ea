"""Gateway worker: settings -> stages -> deps (agent records, feedback, gRPC and HTTP)."""

from __future__ import annotations

import asyncpg
from faststream import FastStream
from opentelemetry.trace import TracerProvider

from services.gateway.bridge import Door
from services.gateway.dashboard import add_dashboard_routes
from services.gateway.fair_consumer import AgentWeights, fair_consumer_factory
from services.gateway.feedback_recorder import FeedbackRecorder, build_feedback_consumer
from services.gateway.grpc_server import start_grpc
from services.gateway.handlers import GatewayDeps, build_stage
from services.gateway.health import Readiness, add_health_routes
from services.gateway.http import build_http_app, start_http
from services.gateway.limits.gate import LimitGate
from services.gateway.limits.store import PgLimits
from services.gateway.openai_door.routes import add_openai_routes
from services.gateway.replay_service import ReplayService
from services.gateway.scoring import ScoreRefresher
from services.gateway.settings import GatewaySettings
from services.gateway.throttle import AuthThrottle, BodyBudget
from shared.auth.identity import CachedAgents
from shared.runtime.worker import Consumes, Wiring, build_app
from shared.store import asyncpg_dsn
from shared.store.agent_changes import AgentChanges
from shared.store.feedback_table import FeedbackTable
from shared.store.policy_cache import open_policy_cache


def create_app(
    settings: GatewaySettings | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
) -> FastStream:
    settings = settings or GatewaySettings.from_env()
    # One count of wrong credentials per address, whichever door they were tried at.
    throttle = AuthThrottle(settings.auth_failures, settings.auth_hashes)
    # agent.request.* is read in weighted fair turns, per agent (fair_consumer.py);
    # each agent's share follows its policy's `weight`, read once the store is open.
    weights = AgentWeights()
    tls = None
    if settings.tls_cert and settings.tls_key:
        tls = (settings.tls_key.read_bytes(), settings.tls_cert.read_bytes())

    async def make_deps(wiring: Wiring) -> GatewayDeps:
        exits = wiring.base.exits
        agents = CachedAgents(wiring.store.agent, save_digest=wiring.store.save_token_digest,
                              ttl=settings.agent_cache_ttl)
        # Revocations pushed by Postgres: the record is dropped when its row changes.
        changes = AgentChanges(asyncpg_dsn(settings.common.database_url), agents.forget,
                               agents.forget_all).start()
        exits.push_async_callback(changes.stop)
        scores = ScoreRefresher(wiring.store.pool, settings.common.confidence,
                                interval=settings.score_refresh,
                                full_interval=settings.score_full_refresh)
        scores.start()
        exits.push_async_callback(scores.stop)
        feedback = FeedbackRecorder(FeedbackTable(wiring.store.pool), on_recorded=scores.mark)
        replays = ReplayService(wiring.nc, follow_for=settings.common.request_deadline,
                                concurrency=settings.replay_concurrency,
                                check_reply=settings.common.nats_authenticated)
        await replays.start()
        exits.push_async_callback(replays.stop)
        # One readiness for both doors: HTTP's /readyz and gRPC's health service.
        signals = wiring.signals
        readiness = Readiness(wiring.nc, wiring.store.pool, lambda: signals.consuming)
        if settings.grpc_listen:
            server = await start_grpc(wiring.nc, settings.grpc_listen, agents,
                                      answer_timeout=settings.answer_timeout,
                                      feedback=feedback, throttle=throttle, tls=tls,
                                      ready=readiness.ready, tracer=wiring.base.tracer)
            exits.push_async_callback(server.stop, 2.0)
        if settings.http_listen:
            http_app = build_http_app(agents=agents, feedback=feedback, throttle=throttle)
            # The OpenAI-compatible door: bridged to the pipeline as gRPC is (bridge.py).
            add_openai_routes(http_app, Door(wiring.nc, agents, throttle,
                                             answer_timeout=settings.answer_timeout,
                                             tracer=wiring.base.tracer),
                              BodyBudget(settings.door_body_rate))
            add_health_routes(http_app, readiness)
            board = settings.dashboard
            if board.token:
                # Its own small pool: an operator's slow query never holds a connection
                # the pipeline's writes wait for.
                pool = await asyncpg.create_pool(asyncpg_dsn(settings.common.database_url),
                                                 min_size=0, max_size=2)
                exits.push_async_callback(pool.close)
                add_dashboard_routes(http_app, pool, token=board.token,
                                     default_days=board.default_days,
                                     max_days=board.max_days, session_ttl=board.session_ttl,
                                     throttle=throttle, refresh=board.refresh, nc=wiring.nc,
                                     login_links=board.login_links)
            runner, _ = await start_http(http_app, settings.http_listen)
            exits.push_async_callback(runner.cleanup)
        if settings.learn.interval > 0:
            # The learning job in the background; the advisory lock keeps replicas from
            # running it at once. Its own connection, not the hot path's pool.
            from shared.learning.job import LearnLoop

            learner = LearnLoop(settings.learn.database_url or settings.common.database_url,
                                settings.learn)
            learner.start()
            exits.push_async_callback(learner.stop)
        # One policy cache for both readers: fair share's weights and the limits gate
        # (which asks without a request id, so A/B candidates never change a limit).
        policies = await open_policy_cache(
            wiring.store.pool, refresh=settings.common.policy_refresh, exits=exits)
        weights.policies = policies
        # Per-agent limits at admission, their state shared by the replicas in Postgres.
        limits = LimitGate(PgLimits(wiring.store.pool), policies, settings.limits)
        # Before the pool closes: what was admitted on allowances is recorded in flight.
        exits.push_async_callback(limits.close)
        return GatewayDeps(**wiring.base.parts(), agents=agents, feedback=feedback,
                           limits=limits)

    stages: list[Consumes[GatewayDeps]] = [
        build_stage(settings),
        build_feedback_consumer(settings.common, max_inflight=settings.feedback_batch),
    ]
    fair = fair_consumer_factory(weight=weights, backlog=settings.pipeline_backlog,
                                 quantum=settings.fair_quantum, scan=settings.fair_scan,
                                 delay=settings.pipeline_delay)
    return build_app(service="gateway", common=settings.common, stages=stages,
                     make_deps=make_deps, tracer_provider=tracer_provider,
                     consumers={stages[0].spec.durable: fair})
