"""Gateway worker: settings -> its two consumers (admission in fair turns, feedback) ->
deps (agents' records, the feedback recorder, replays, limits: bootstrap.py). The doors
(gRPC, HTTP, the OpenAI door, the dashboard) are a worker of their own
(services/doors); the learning job too (services/learner)."""

from __future__ import annotations

from faststream import FastStream
from opentelemetry.trace import TracerProvider

from services.gateway.bootstrap import gateway_deps
from services.gateway.fair_consumer import AgentWeights, fair_consumer_factory
from services.gateway.feedback_recorder import build_feedback_consumer
from services.gateway.handlers import GatewayDeps, build_stage
from services.gateway.settings import GatewaySettings
from shared.runtime.worker import Consumes, Wiring, build_app


def create_app(
    settings: GatewaySettings | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
) -> FastStream:
    settings = settings or GatewaySettings.from_env()
    # agent.request.* is read in weighted fair turns, per agent (fair_consumer.py);
    # each agent's share follows its policy's `weight`, read once the store is open.
    weights = AgentWeights()

    async def make_deps(wiring: Wiring) -> GatewayDeps:
        return await gateway_deps(settings, wiring, weights)

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
