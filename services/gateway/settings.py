from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import msgspec

from services.gateway.dashboard.settings import DashboardSettings
from services.gateway.limits.settings import LimitSettings
from services.gateway.throttle import DEFAULT_AUTH_FAILURES, DEFAULT_AUTH_HASHES, DEFAULT_BODY_RATE
from shared.common.settings import CommonSettings, env, read_env
from shared.learning.settings import LearnSettings


def _unless_off(value: str) -> str:
    """The value, or "" for off (empty or "off")."""
    value = value.strip()
    return "" if value.lower() == "off" else value


class GatewaySettings(msgspec.Struct, frozen=True, kw_only=True):
    common: CommonSettings
    # gRPC AskAgent / AskAgentStream / Feedback listener; empty host:port disables it.
    grpc_listen: Annotated[str, env("GATEWAY_GRPC_LISTEN")] = ""
    # Seconds the gRPC and OpenAI doors follow an answer at most (a request's timeout_ms
    # plus 2 s when that is shorter).
    answer_timeout: Annotated[float, env("GATEWAY_ANSWER_TIMEOUT")] = 120.0
    # Requests one replica pulls and handles at once.
    batch_size: Annotated[int, env("GATEWAY_BATCH")] = 32
    # Fair share (fair_consumer.py): pipeline messages admitted and not yet through it,
    # over all replicas, are kept under GATEWAY_PIPELINE_DELAY seconds of the measured
    # drain rate and never under GATEWAY_PIPELINE_BACKLOG (0: unbounded); requests one
    # turn of a weight-1 agent takes; seconds between scans for requests no doorbell
    # announced. A fixed bound of 8 kept other agents' p95 under 0.5 s in `bench
    # fairness` on a loaded machine (16: 0.57 s, 32: 1.6 s) but caps a fast pipeline;
    # the delay keeps the queue short in time, whatever the pipeline's speed.
    pipeline_backlog: Annotated[int, env("GATEWAY_PIPELINE_BACKLOG")] = 8
    pipeline_delay: Annotated[float, env("GATEWAY_PIPELINE_DELAY")] = 0.1
    fair_quantum: Annotated[int, env("GATEWAY_FAIR_QUANTUM")] = 4
    fair_scan: Annotated[float, env("GATEWAY_FAIR_SCAN")] = 1.0
    # TLS for the gRPC listener (both set: TLS; neither: plain text).
    tls_cert: Annotated[Path | None, env("GATEWAY_TLS_CERT")] = None
    tls_key: Annotated[Path | None, env("GATEWAY_TLS_KEY")] = None
    # Seconds an agent record (trust, revocation, token check) is cached.
    agent_cache_ttl: Annotated[float, env("GATEWAY_AGENT_CACHE_TTL")] = 5.0
    # The learning job, run every `learn.interval` seconds in this worker (0 = never).
    learn: LearnSettings = LearnSettings()
    # HTTP listener (POST /agents/{agent_id}/feedback, the dashboard); "" disables it.
    http_listen: Annotated[str, env("GATEWAY_HTTP_LISTEN", parse=_unless_off)] = ""
    # The operator dashboard on the HTTP listener (off without GATEWAY_DASHBOARD_TOKEN).
    dashboard: DashboardSettings = DashboardSettings()
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
    # Wrong credentials (agent tokens, the dashboard's) one client address may present
    # before its wrong ones are answered 429 / RESOURCE_EXHAUSTED (right ones are always
    # let in) for the rest of the window: a `limits` rate ("20/minute", "5 per 10
    # seconds"); "off" disables it.
    auth_failures: Annotated[str, env("GATEWAY_AUTH_FAILURES",
                                      parse=_unless_off)] = DEFAULT_AUTH_FAILURES
    # KiB of chat bodies one agent may send the OpenAI door a second (throttle.py
    # BodyBudget): past it 429 RATE_LIMITED before the body is parsed; "off": no bound.
    door_body_rate: Annotated[str, env("GATEWAY_DOOR_BODY_RATE",
                                       parse=_unless_off)] = DEFAULT_BODY_RATE
    # bcrypt checks (agents whose fast digest is not written yet) per window, over all
    # addresses together; past it such tokens are refused unchecked; "off": no bound.
    auth_hashes: Annotated[str, env("GATEWAY_AUTH_HASHES",
                                    parse=_unless_off)] = DEFAULT_AUTH_HASHES

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> GatewaySettings:
        common = CommonSettings.from_env(environ)
        return read_env(cls, environ, common=common,
                        learn=LearnSettings.from_env(environ, common),
                        dashboard=DashboardSettings.from_env(environ),
                        limits=LimitSettings.from_env(environ))
