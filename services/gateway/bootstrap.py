"""The gateway's composition root in small steps (as cosmicpython's bootstrap): each
builds one dependency of the admission stage or the feedback consumer from the settings
and what the runtime opened (`Wiring`), registers what closes it on the worker's exit
stack, and returns it. `app.py` calls them in order."""

from __future__ import annotations

from services.gateway.fair_consumer import AgentWeights
from services.gateway.feedback_recorder import FeedbackRecorder
from services.gateway.handlers import GatewayDeps
from services.gateway.limits.gate import LimitGate
from services.gateway.limits.store import PgLimits
from services.gateway.replay_service import ReplayService
from services.gateway.scoring import ScoreRefresher
from services.gateway.settings import GatewaySettings
from shared.auth.identity import CachedAgents
from shared.runtime.worker import Wiring
from shared.store import asyncpg_dsn
from shared.store.agent_changes import AgentChanges
from shared.store.feedback_table import FeedbackTable
from shared.store.policy_cache import PolicyCache, open_policy_cache


def agent_records(settings: GatewaySettings, wiring: Wiring) -> CachedAgents:
    """Is the agent still active, is it trusted: its record, cached; a revocation pushed
    by Postgres drops it at once (shared.store.agent_changes)."""
    agents = CachedAgents(wiring.store.agent, ttl=settings.common.agent_cache_ttl)
    changes = AgentChanges(asyncpg_dsn(settings.common.database_url), agents.forget,
                           agents.forget_all).start()
    wiring.base.exits.push_async_callback(changes.stop)
    return agents


def feedback_recorder(settings: GatewaySettings, wiring: Wiring) -> FeedbackRecorder:
    """Verdicts recorded, the agent's scores refreshed shortly after (scoring.py)."""
    scores = ScoreRefresher(wiring.store.pool, settings.common.confidence,
                            interval=settings.score_refresh,
                            full_interval=settings.score_full_refresh)
    scores.start()
    wiring.base.exits.push_async_callback(scores.stop)
    return FeedbackRecorder(FeedbackTable(wiring.store.pool), on_recorded=scores.mark)


async def replays(settings: GatewaySettings, wiring: Wiring) -> None:
    """Late replays (`agent.replay.<id>`), served by this replica too."""
    service = ReplayService(wiring.nc, follow_for=settings.common.request_deadline,
                            concurrency=settings.replay_concurrency,
                            check_reply=settings.common.nats_authenticated)
    await service.start()
    wiring.base.exits.push_async_callback(service.stop)


async def policies(settings: GatewaySettings, wiring: Wiring, weights: AgentWeights
                   ) -> PolicyCache:
    """One policy cache for the gateway's readers: fair share's weights, the limits gate
    (which asks without a request id, so A/B candidates never change a limit) and the
    admission's check of a model a request names."""
    cache = await open_policy_cache(
        wiring.store.pool, refresh=settings.common.policy_refresh, exits=wiring.base.exits)
    weights.policies = cache
    return cache


async def limits(settings: GatewaySettings, wiring: Wiring, policies: PolicyCache
                 ) -> LimitGate:
    """The limits gate, its state shared by the replicas in Postgres."""
    gate = LimitGate(PgLimits(wiring.store.pool), policies, settings.limits)
    # Before the pool closes: what was admitted on allowances is recorded in flight.
    wiring.base.exits.push_async_callback(gate.close)
    return gate


async def gateway_deps(settings: GatewaySettings, wiring: Wiring, weights: AgentWeights
                       ) -> GatewayDeps:
    agents = agent_records(settings, wiring)
    feedback = feedback_recorder(settings, wiring)
    await replays(settings, wiring)
    cache = await policies(settings, wiring, weights)
    gate = await limits(settings, wiring, cache)
    return GatewayDeps(**wiring.base.parts(), agents=agents, feedback=feedback, limits=gate,
                       policies=cache)
