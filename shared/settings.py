"""Environment readers and the settings every worker shares.

Each service has one settings object (in its own `settings.py`) built from the
environment in `app.py` only; this module holds the common part.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import msgspec


def env_str(name: str, default: str = "", environ: Mapping[str, str] | None = None) -> str:
    return (environ if environ is not None else os.environ).get(name, default)


def env_int(name: str, default: int, environ: Mapping[str, str] | None = None) -> int:
    raw = env_str(name, "", environ)
    return int(raw) if raw.strip() else default


def env_float(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    raw = env_str(name, "", environ)
    return float(raw) if raw.strip() else default


def env_bool(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    raw = env_str(name, "", environ).strip().lower()
    if not raw:
        return default
    return raw in ("1", "true", "yes", "on")


class CommonSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Bus, store and tracing settings every worker reads."""

    nats_url: str = "nats://127.0.0.1:4222"
    database_url: str = ""
    # Seconds a stage may hold a message before JetStream redelivers it elsewhere.
    ack_wait: float = 30.0
    # Deliveries before a message is treated as poison and answered with an error.
    max_deliver: int = 5
    # How long answers stay readable for late subscribers.
    response_ttl: float = 3600.0
    otlp_endpoint: str = ""
    log_level: str = "INFO"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CommonSettings:
        return cls(
            nats_url=env_str("NATS_URL", "nats://127.0.0.1:4222", environ),
            database_url=env_str("DATABASE_URL", "", environ),
            ack_wait=env_float("STAGE_ACK_WAIT", 30.0, environ),
            max_deliver=env_int("STAGE_MAX_DELIVER", 5, environ),
            response_ttl=env_float("RESPONSE_TTL", 3600.0, environ),
            otlp_endpoint=env_str("OTEL_EXPORTER_OTLP_ENDPOINT", "", environ),
            log_level=env_str("LOG_LEVEL", "INFO", environ),
        )
