from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import msgspec

from services.gateway.dashboard.settings import DashboardSettings
from services.gateway.throttle import DEFAULT_AUTH_FAILURES
from shared.common.settings import CommonSettings, env_float, env_int, env_str
from shared.learning.settings import LearnSettings


class GatewaySettings(msgspec.Struct, frozen=True, kw_only=True):
    common: CommonSettings
    # gRPC AskAgent / AskAgentStream / Feedback listener; empty host:port disables it.
    grpc_listen: str = ""
    answer_timeout: float = 120.0
    batch_size: int = 32
    # TLS for the gRPC listener (both set: TLS; neither: plain text).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # Seconds an agent record (trust, revocation, token check) is cached.
    agent_cache_ttl: float = 5.0
    # The learning job, run every `learn.interval` seconds in this worker (0 = never).
    learn: LearnSettings = LearnSettings()
    # HTTP listener (POST /agents/{agent_id}/feedback, the dashboard); "" disables it.
    http_listen: str = ""
    # The operator dashboard on the HTTP listener (off without GATEWAY_DASHBOARD_TOKEN).
    dashboard: DashboardSettings = DashboardSettings()
    # Feedback messages one replica handles at once.
    feedback_batch: int = 16
    # Seconds between score refreshes of the agents that sent feedback, and between
    # full refreshes (every agent, implicit outcomes included; 0: left to the learning
    # job).
    score_refresh: float = 5.0
    score_full_refresh: float = 300.0
    # Wrong credentials (agent tokens, the dashboard's) one client address may present
    # before its credentials are refused unchecked for the rest of the window: a
    # `limits` rate ("20/minute", "5 per 10 seconds"); "off" disables it.
    auth_failures: str = DEFAULT_AUTH_FAILURES

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> GatewaySettings:
        common = CommonSettings.from_env(environ)
        return cls(
            common=common,
            grpc_listen=env_str("GATEWAY_GRPC_LISTEN", "", environ),
            answer_timeout=env_float("GATEWAY_ANSWER_TIMEOUT", 120.0, environ),
            batch_size=env_int("GATEWAY_BATCH", 32, environ),
            tls_cert=_path(env_str("GATEWAY_TLS_CERT", "", environ)),
            tls_key=_path(env_str("GATEWAY_TLS_KEY", "", environ)),
            agent_cache_ttl=env_float("GATEWAY_AGENT_CACHE_TTL", 5.0, environ),
            learn=LearnSettings.from_env(environ, common),
            dashboard=DashboardSettings.from_env(environ),
            http_listen=_unless_off(env_str("GATEWAY_HTTP_LISTEN", "", environ)),
            feedback_batch=env_int("GATEWAY_FEEDBACK_BATCH", 16, environ),
            score_refresh=env_float("SCORE_REFRESH", 5.0, environ),
            score_full_refresh=env_float("SCORE_FULL_REFRESH", 300.0, environ),
            auth_failures=_unless_off(env_str("GATEWAY_AUTH_FAILURES", DEFAULT_AUTH_FAILURES,
                                          environ)),
        )


def _path(value: str) -> Path | None:
    return Path(value) if value else None


def _unless_off(value: str) -> str:
    """The value, or "" for off (unset, empty or "off")."""
    value = value.strip()
    return "" if value.lower() == "off" else value
