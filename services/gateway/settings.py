from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

import msgspec

from services.gateway.limits.settings import LimitSettings
from shared.common.settings import CommonSettings, env, read_env


class GatewaySettings(msgspec.Struct, frozen=True, kw_only=True):
    common: CommonSettings
    # Requests the admission stage takes from the request stream per pull (and works on
    # at once).
    batch_size: Annotated[int, env("GATEWAY_BATCH")] = 32
    # Fair share (fair_consumer.py): pipeline messages admitted and not yet through it,
    # over all replicas, are kept under what the measured drain rate clears in the
    # pipeline's least residence plus GATEWAY_PIPELINE_DELAY seconds, and never under
    # GATEWAY_PIPELINE_BACKLOG (0: unbounded); requests one turn of a weight-1 agent
    # takes; seconds between scans for requests no doorbell announced. A fixed bound of
    # 8 kept other agents' p95 under 0.5 s in `bench fairness` on a loaded machine (16:
    # 0.57 s, 32: 1.6 s) but caps a fast pipeline; the delay keeps the waiting short in
    # time, whatever the pipeline's speed. With the stages taking turns by agent
    # (STAGE_LOOKAHEAD) the window no longer decides what a victim waits, so 0.2 s: 0.1 s
    # cost `bench pipeline` ~5-12% of its throughput (0.1 s with STAGE_LOOKAHEAD=0;
    # issue 32, docs/explanation/fair-share.md).
    pipeline_backlog: Annotated[int, env("GATEWAY_PIPELINE_BACKLOG")] = 8
    pipeline_delay: Annotated[float, env("GATEWAY_PIPELINE_DELAY")] = 0.2
    fair_quantum: Annotated[int, env("GATEWAY_FAIR_QUANTUM")] = 4
    fair_scan: Annotated[float, env("GATEWAY_FAIR_SCAN")] = 1.0
    # Per-agent limits' global defaults (LIMIT_*; limits/settings.py).
    limits: LimitSettings = LimitSettings()
    # Feedback messages one replica handles at once.
    feedback_batch: Annotated[int, env("GATEWAY_FEEDBACK_BATCH")] = 16
    # Late replays (`agent.replay.<id>`) one replica serves at once, each through a
    # short-lived consumer of AGENT_RESPONSES; past it a replay is refused
    # CONCURRENCY_LIMITED.
    replay_concurrency: Annotated[int, env("GATEWAY_REPLAY_CONCURRENCY")] = 32
    # Seconds between score refreshes of the agents that sent feedback, and between
    # full refreshes (every agent, implicit outcomes included; 0: left to the learning
    # job).
    score_refresh: Annotated[float, env("SCORE_REFRESH")] = 5.0
    score_full_refresh: Annotated[float, env("SCORE_FULL_REFRESH")] = 300.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> GatewaySettings:
        return read_env(cls, environ, common=CommonSettings.from_env(environ),
                        limits=LimitSettings.from_env(environ))
