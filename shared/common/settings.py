"""Environment readers and the settings every worker shares.

Each service has one settings object (in its own `settings.py`) built from the
environment in `app.py` only; this module holds the common part.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import msgspec

from shared.policy.confidence import ConfidenceParams


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
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={raw!r}: expected on/off")


class CommonSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Bus, store and tracing settings every worker reads."""

    # One URL or a comma-separated list (every node of a cluster: a client that loses
    # its server reconnects to another at once).
    nats_url: str = "nats://127.0.0.1:4222"
    # Replicas of every stream: 3 keeps every stream through the loss of any one node
    # of a cluster. 0: as many as the servers, up to 3 (1 on a single server).
    stream_replicas: int = 0
    database_url: str = ""
    # Seconds a stage may hold a message without a sign of life before JetStream
    # redelivers it to another replica (a busy stage keeps its messages alive).
    ack_wait: float = 2.0
    # Deliveries before a message is treated as poison, answered and dead-lettered
    # (retries are bounded by the request's deadline first).
    max_deliver: int = 20
    # Seconds a request may take end to end (callers may ask for less: `timeout_ms`).
    request_deadline: float = 120.0
    # How long answers stay readable for late subscribers.
    response_ttl: float = 3600.0
    otlp_endpoint: str = ""
    # Prometheus scrape endpoint of the worker's metrics (shared.runtime.metrics): 0 = off. Under
    # `intentroute up` it is the first port, each worker process takes the next one.
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    # Seconds between two readings of the stages' consumer lag (with metrics on).
    metrics_interval: float = 5.0
    log_level: str = "INFO"
    # Where the embedded stack keeps its state: servers' data, credentials, index, heads.
    state_dir: Path = Path(".intentroute")
    # Sentence encoder: precision of per-query encoders ("fp32", "int8", "int8-block"),
    # of ingestion, and where exported ONNX graphs are cached.
    encoder_precision: str = "fp32"
    ingest_precision: str = "fp32"
    onnx_cache_dir: Path = Path.home() / ".cache" / "intentroute" / "onnx"
    # NATS credentials (one kind at a time): user + password, a token, or a .creds file
    # (decentralized JWT auth on an external server). Unset = anonymous (open servers only).
    # HMAC key of the gateway's admission stamp (shared.auth.admission); every worker of a
    # deployment holds the same one. Required when NATS authentication is on.
    admission_key: str = ""
    nats_user: str = ""
    nats_password: str = ""
    nats_token: str = ""
    nats_creds: str = ""
    # Reply subjects start with this; "" = `_INBOX.<user>` when a user is set, which is
    # the only inbox a user of the embedded stack may subscribe to.
    nats_inbox_prefix: str = ""
    # TLS for clients: the CA that signed the server's certificate, and a client
    # certificate + key when the server verifies clients.
    nats_tls_ca: str = ""
    nats_tls_cert: str = ""
    nats_tls_key: str = ""
    # Per-agent accounting (ADR-0006): tokens, model, fallback, time to first chunk in
    # the request log and the implicit outcomes derived from it. Off only to measure
    # what it costs (`bench pipeline --no-accounting`).
    accounting: bool = True
    # Seconds between re-reads of the per-agent policies (`intentroute agent set`).
    policy_refresh: float = 10.0
    # Retention (shared/accounting/retention.py): days the request log's partitions are
    # kept, and days the daily rollups are kept.
    log_hot_days: int = 30
    rollup_keep_days: int = 365
    # Agent confidence (shared/policy/confidence.py): prior strength, daily decay, divergence
    # bound; the gateway's score refresh and the learning job read the same.
    confidence: ConfidenceParams = ConfidenceParams()

    @property
    def nats_servers(self) -> list[str]:
        return nats_servers(self.nats_url)

    def replicas(self, servers: int | None = None) -> int:
        """Stream replicas on `servers` nodes (default: as many as NATS_URL lists)."""
        count = len(self.nats_servers) if servers is None else servers
        return self.stream_replicas or max(1, min(count, 3))

    @property
    def nats_authenticated(self) -> bool:
        """True when this connection carries a credential (streams are then the admin's)."""
        return bool(self.nats_user or self.nats_token or self.nats_creds)

    @property
    def inbox_prefix(self) -> str:
        if self.nats_inbox_prefix:
            return self.nats_inbox_prefix
        return f"_INBOX.{self.nats_user}" if self.nats_user else ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CommonSettings:
        return cls(
            nats_url=env_str("NATS_URL", "nats://127.0.0.1:4222", environ),
            stream_replicas=env_int("NATS_STREAM_REPLICAS", 0, environ),
            database_url=env_str("DATABASE_URL", "", environ),
            ack_wait=env_float("STAGE_ACK_WAIT", 2.0, environ),
            max_deliver=env_int("STAGE_MAX_DELIVER", 20, environ),
            request_deadline=env_float("REQUEST_DEADLINE", 120.0, environ),
            response_ttl=env_float("RESPONSE_TTL", 3600.0, environ),
            otlp_endpoint=env_str("OTEL_EXPORTER_OTLP_ENDPOINT", "", environ),
            metrics_port=env_int("METRICS_PORT", 0, environ),
            metrics_host=env_str("METRICS_HOST", "127.0.0.1", environ),
            metrics_interval=env_float("METRICS_INTERVAL", 5.0, environ),
            log_level=env_str("LOG_LEVEL", "INFO", environ),
            state_dir=Path(env_str("INTENTROUTE_HOME", ".intentroute", environ)),
            encoder_precision=env_str("INTENTROUTE_ENCODER_PRECISION", "fp32", environ),
            ingest_precision=env_str("INTENTROUTE_INGEST_PRECISION", "fp32", environ),
            onnx_cache_dir=_onnx_cache_dir(environ),
            admission_key=env_str("INTENTROUTE_ADMISSION_KEY", "", environ),
            nats_user=env_str("NATS_USER", "", environ),
            nats_password=env_str("NATS_PASSWORD", "", environ),
            nats_token=env_str("NATS_TOKEN", "", environ),
            nats_creds=env_str("NATS_CREDS", "", environ),
            nats_inbox_prefix=env_str("NATS_INBOX_PREFIX", "", environ),
            nats_tls_ca=env_str("NATS_TLS_CA", "", environ),
            nats_tls_cert=env_str("NATS_TLS_CERT", "", environ),
            nats_tls_key=env_str("NATS_TLS_KEY", "", environ),
            accounting=env_bool("ACCOUNTING", True, environ),
            policy_refresh=env_float("POLICY_REFRESH", 10.0, environ),
            log_hot_days=env_int("REQUEST_LOG_HOT_DAYS", 30, environ),
            rollup_keep_days=env_int("ROLLUP_KEEP_DAYS", 365, environ),
            confidence=ConfidenceParams(
                prior_strength=env_float("CONFIDENCE_PRIOR_STRENGTH", 10.0, environ),
                daily_decay=env_float("CONFIDENCE_DAILY_DECAY", 0.9, environ),
                divergence_bound=env_float("CONFIDENCE_DIVERGENCE", 0.2, environ),
            ),
        )


def nats_servers(url: str) -> list[str]:
    """A `NATS_URL` (one URL or a comma-separated list) as nats.connect's server list."""
    return [part.strip() for part in url.split(",") if part.strip()]


def _onnx_cache_dir(environ: Mapping[str, str] | None) -> Path:
    explicit = env_str("INTENTROUTE_ONNX_CACHE", "", environ)
    if explicit:
        return Path(explicit)
    base = env_str("XDG_CACHE_HOME", "", environ) or str(Path.home() / ".cache")
    return Path(base) / "intentroute" / "onnx"
