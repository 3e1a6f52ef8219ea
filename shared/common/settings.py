"""The settings every worker shares (`CommonSettings`), and those several stages or the
CLI read, with the enums and defaults they use.

Settings are declared once per field with the variable they are read from, and read by
one helper (shared.common.envvars: `env`, `env_group`, `read_env`, ...; re-exported
here, where their users import them). Each service has one settings object (in its own
`settings.py`) built from the environment in `app.py` only; this module holds the common
part, and a variable is declared by one field of one class
(tests/unit/test_settings_declared.py): settings several classes need live here, the
others read them from `common`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import msgspec

from shared.common.envvars import (
    Env,
    EnvGroup,
    SettingError,
    declared_variables,
    env,
    env_group,
    is_set,
    read_env,
    refuse_retired,
    secret_env,
)
from shared.common.limits import StreamLimits
from shared.common.otel import OtelSettings
from shared.policy.confidence import ConfidenceParams

__all__ = [
    "LOG_HOT_DAYS",
    "ROLLUP_KEEP_DAYS",
    "CommonSettings",
    "Env",
    "EnvGroup",
    "LogFormat",
    "OpenAIServer",
    "SettingError",
    "declared_variables",
    "env",
    "env_group",
    "is_set",
    "nats_servers",
    "read_env",
    "refuse_retired",
    "secret_env",
]


class LogFormat(enum.Enum):
    """How a worker writes its log lines (shared.runtime.logs): text, or one JSON object
    per line."""

    TEXT = "text"
    JSON = "json"


class OpenAIServer(enum.Enum):
    """The dialect of the OpenAI-compatible server (OPENAI_SERVER): how it constrains a
    label (shared.llm)."""

    OPENAI = "openai"
    LLAMACPP = "llamacpp"


# Retention's defaults, which the learning job's settings (given the common ones by
# `LearnSettings.from_env`) keep when built directly.
LOG_HOT_DAYS = 30
ROLLUP_KEEP_DAYS = 365


def _onnx_cache(_: Any, environ: Mapping[str, str]) -> Path:
    """INTENTROUTE_ONNX_CACHE unset: under $XDG_CACHE_HOME (default ~/.cache)."""
    base = environ.get("XDG_CACHE_HOME", "") or str(Path.home() / ".cache")
    return Path(base) / "intentroute" / "onnx"


class CommonSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Bus, store and tracing settings every worker reads, and those several stages or
    the CLI read (model servers, the index)."""

    # One URL or a comma-separated list (every node of a cluster: a client that loses
    # its server reconnects to another at once).
    nats_url: Annotated[str, env("NATS_URL")] = "nats://127.0.0.1:4222"
    # Replicas of every stream: 3 keeps every stream through the loss of any one node
    # of a cluster. 0: as many as the servers, up to 3 (1 on a single server).
    stream_replicas: Annotated[int, env("NATS_STREAM_REPLICAS")] = 0
    # PostgreSQL (sessions, history, the request log); "": the CLI's embedded server.
    database_url: Annotated[str, env("DATABASE_URL")] = ""
    # Seconds a read on the request path (the intent history, the previous answer, the
    # last turns) waits for Postgres and the session's queued rows; past it the stage
    # goes on without it, and the decision says `history_unavailable`
    # (shared.runtime.row_queue). 0.25 s: the rows' own wait (ROWS_WAIT); a read is an
    # indexed lookup of a few rows, so only a database that is away waits this long.
    store_read_wait: Annotated[float, env("STORE_READ_WAIT", unit="seconds")] = 0.25
    # Seconds a stage may hold a message without a sign of life before JetStream
    # redelivers it to another replica (a busy stage keeps its messages alive).
    ack_wait: Annotated[float, env("STAGE_ACK_WAIT", unit="seconds")] = 2.0
    # Deliveries before a message is treated as poison, answered and dead-lettered
    # (retries are bounded by the request's deadline first).
    max_deliver: Annotated[int, env("STAGE_MAX_DELIVER")] = 20
    # Messages a stage replica holds beyond its batch, waiting their agent's turn
    # (shared.runtime.turns): a request behind a flood waits behind one message of each
    # other agent there, not the flood's whole queue (0: arrival order). 256 covers the
    # gateway's admitted window at a busy stage here (~650 req/s x 0.2 s plus the
    # residence; with 64 most of the window still waited in the stream, in arrival
    # order: `bench fairness`, docs/explanation/fair-share.md). With it, when every slot
    # of a replica is taken, an agent with no handler running there takes one of
    # batch // 4 spare slots (at least one; one per agent).
    stage_lookahead: Annotated[int, env("STAGE_LOOKAHEAD")] = 256
    # Seconds a request may take end to end (callers may ask for less: `timeout_ms`).
    request_deadline: Annotated[float, env("REQUEST_DEADLINE", unit="seconds")] = 120.0
    # How long answers stay readable for late subscribers.
    response_ttl: Annotated[float, env("RESPONSE_TTL", unit="seconds")] = 3600.0
    # OpenTelemetry's standard settings that pick the exporters (shared.common.otel);
    # the SDK reads the others (endpoints, headers, sampler, ...) itself.
    otel: Annotated[OtelSettings, env_group(
        sdk_disabled="OTEL_SDK_DISABLED",
        service_name="OTEL_SERVICE_NAME",
        traces_exporter="OTEL_TRACES_EXPORTER",
        metrics_exporter="OTEL_METRICS_EXPORTER",
        protocol="OTEL_EXPORTER_OTLP_PROTOCOL",
        traces_protocol="OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        metrics_protocol="OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
        endpoint="OTEL_EXPORTER_OTLP_ENDPOINT",
        traces_endpoint="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        metrics_endpoint="OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    )] = OtelSettings()
    # Prometheus scrape endpoint of the worker's metrics (shared.runtime.metrics): 0 = off
    # (unless OTEL_METRICS_EXPORTER names prometheus: then 9464). Under `intentroute up`
    # (default 9464 there) it is the first port, each worker process takes the next one.
    metrics_port: Annotated[int, env("METRICS_PORT")] = 0
    metrics_host: Annotated[str, env("METRICS_HOST")] = "127.0.0.1"
    # Seconds between two readings of the stages' consumer lag (with metrics on).
    metrics_interval: Annotated[float, env("METRICS_INTERVAL", unit="seconds")] = 5.0
    # Log lines (shared.runtime.logs): the level (per-request lines are DEBUG), and text
    # or one JSON object per line.
    log_level: Annotated[str, env("LOG_LEVEL")] = "INFO"
    log_format: Annotated[LogFormat, env("LOG_FORMAT")] = LogFormat.TEXT
    # Where the embedded stack keeps its state: servers' data, credentials, index, heads.
    # Unset: `up` keeps it in ./.intentroute; every other command finds the nearest
    # .intentroute of a running `up` in the current folder or its parents (as git finds
    # .git). Relative paths are taken from the current folder.
    state_dir: Annotated[Path, env("INTENTROUTE_HOME")] = Path(".intentroute")
    # Sentence encoder: precision of per-query encoders ("fp32", "int8", "int8-block"),
    # of ingestion, and where exported ONNX graphs are cached.
    encoder_precision: Annotated[str, env("INTENTROUTE_ENCODER_PRECISION")] = "fp32"
    ingest_precision: Annotated[str, env("INTENTROUTE_INGEST_PRECISION")] = "fp32"
    onnx_cache_dir: Annotated[Path, env("INTENTROUTE_ONNX_CACHE", blank_is_unset=True,
                                        unset=_onnx_cache)] = _onnx_cache(None, {})
    # The retriever's index (the CLI's `ingest` and `up` default to `<state dir>/index`
    # instead when INDEX_DIR is unset: intentroute/settings.py).
    index_dir: Annotated[Path, env("INDEX_DIR")] = Path(".intentroute/index")
    # HMAC key of the gateway's admission stamp (shared.auth.admission); every worker of a
    # deployment holds the same one. Required when NATS authentication is on. Secrets
    # (secret_env): INTENTROUTE_ADMISSION_KEY_FILE / NATS_PASSWORD_FILE name files instead.
    admission_key: Annotated[str, secret_env("INTENTROUTE_ADMISSION_KEY")] = ""
    # NATS credentials (one kind at a time): user + password, a token, or a .creds file
    # (decentralized JWT auth on an external server). Unset = anonymous (open servers only).
    nats_user: Annotated[str, env("NATS_USER")] = ""
    nats_password: Annotated[str, secret_env("NATS_PASSWORD")] = ""
    nats_token: Annotated[str, env("NATS_TOKEN")] = ""
    nats_creds: Annotated[str, env("NATS_CREDS")] = ""
    # Reply subjects start with this; "" = `_INBOX.<user>` when a user is set, which is
    # the only inbox a user of the embedded stack may subscribe to.
    nats_inbox_prefix: Annotated[str, env("NATS_INBOX_PREFIX")] = ""
    # TLS for clients: the CA that signed the server's certificate, and a client
    # certificate + key when the server verifies clients.
    nats_tls_ca: Annotated[str, env("NATS_TLS_CA")] = ""
    nats_tls_cert: Annotated[str, env("NATS_TLS_CERT")] = ""
    nats_tls_key: Annotated[str, env("NATS_TLS_KEY")] = ""
    # Model servers (the generator's answers, the classifier's Layer 3, the retriever's
    # LLM relevance judge, the CLI's reports): Ollama's address ("" = none), the main
    # slot's model and the conversational slot's (which falls back to the main one).
    ollama_host: Annotated[str, env("OLLAMA_HOST")] = ""
    model_main: Annotated[str, env("OLLAMA_MODEL_NAME")] = ""
    model_conversational: Annotated[str, env("OLLAMA_MODEL_NAME_CONVERSATIONAL")] = ""
    # An OpenAI-compatible chat server (`up --llm` runs llama.cpp's), as the OpenAI SDK
    # reads it: the base URL used as given, `/v1` included (https://api.openai.com/v1;
    # `/chat/completions` is appended), and the slots' models there (unset: the
    # OLLAMA_MODEL_NAME* names; see `slot_model`). Its key: every LLM role sends it,
    # `intentroute llm-server` requires it. OPENAI_SERVER names its dialect for labels
    # (Layer 3, the relevance judge): "openai" constrains them with `response_format`,
    # "llamacpp" with llama.cpp's `grammar` field.
    openai_base_url: Annotated[str, env("OPENAI_BASE_URL")] = ""
    openai_model: Annotated[str, env("OPENAI_MODEL")] = ""
    openai_model_conversational: Annotated[str, env("OPENAI_MODEL_CONVERSATIONAL")] = ""
    openai_api_key: Annotated[str, env("OPENAI_API_KEY")] = ""
    openai_server: Annotated[OpenAIServer, env("OPENAI_SERVER")] = OpenAIServer.OPENAI
    # The model fleet (shared.llm.fleet): a TOML file declaring every backend and its
    # models ("" = the seed variables above as a one-backend fleet), and the models the
    # slots and the label roles use (`backend/model`; "" = the fleet's own).
    llm_fleet: Annotated[str, env("LLM_FLEET")] = ""
    slot_main: Annotated[str, env("MODEL_MAIN")] = ""
    slot_conversational: Annotated[str, env("MODEL_CONVERSATIONAL")] = ""
    classifier_llm_chain: Annotated[str, env("CLASSIFIER_LLM_CHAIN")] = ""
    relevance_llm_chain: Annotated[str, env("RELEVANCE_LLM_CHAIN")] = ""
    # How long a model call may take (shared.llm.walk.Timing), unless the agent's policy
    # says (`ttft_ms`, `stall_ms`): to the server's first byte, to the first token, and
    # between two tokens; past one, the chain's next step answers.
    llm_first_byte_ms: Annotated[float, env("LLM_FIRST_BYTE_MS", unit="milliseconds")] = 5000.0
    llm_ttft_ms: Annotated[float, env("LLM_TTFT_MS", unit="milliseconds")] = 15000.0
    llm_stall_ms: Annotated[float, env("LLM_STALL_MS", unit="milliseconds")] = 5000.0
    # A backend's circuit (shared.llm.circuit): opens after this many failures in a row,
    # probed again after the cooldown.
    llm_circuit_failures: Annotated[int, env("LLM_CIRCUIT_FAILURES")] = 3
    llm_circuit_cooldown: Annotated[float, env("LLM_CIRCUIT_COOLDOWN",
                                               unit="seconds")] = 5.0
    # Per-agent accounting (ADR-0006): tokens, model, fallback, time to first chunk in
    # the request log and the implicit outcomes derived from it. Off only to measure
    # what it costs (`bench pipeline --no-accounting`).
    accounting: Annotated[bool, env("ACCOUNTING")] = True
    # Seconds an agent record (trust, revocation, token check) is cached, by the
    # gateway's admission and by the doors' token checks alike.
    agent_cache_ttl: Annotated[float, env("GATEWAY_AGENT_CACHE_TTL", unit="seconds")] = 5.0
    # Seconds between re-reads of the per-agent policies (`intentroute agent set`).
    policy_refresh: Annotated[float, env("POLICY_REFRESH", unit="seconds")] = 10.0
    # Retention (shared/accounting/retention.py): days the request log's partitions are
    # kept, and days the daily rollups are kept.
    log_hot_days: Annotated[int, env("REQUEST_LOG_HOT_DAYS", unit="days")] = LOG_HOT_DAYS
    rollup_keep_days: Annotated[int, env("ROLLUP_KEEP_DAYS", unit="days")] = ROLLUP_KEEP_DAYS
    # Bounds of the streams (StreamLimits), applied by whoever declares them.
    streams: Annotated[StreamLimits, env_group(
        max_bytes="STREAM_MAX_BYTES",
        max_msgs="STREAM_MAX_MSGS",
        work_max_age="STREAM_MAX_AGE",
        dead_letter_max_age="DLQ_MAX_AGE",
        per_agent="STREAM_MAX_PER_AGENT",
        max_consumers="STREAM_MAX_CONSUMERS",
    )] = StreamLimits()
    # Conversations one agent keeps (sessions rows and their messages): past it, each new
    # session expires the agent's least recently used one. 0: no cap.
    max_sessions_per_agent: Annotated[int, env("MAX_SESSIONS_PER_AGENT")] = 10_000
    # The per-agent answer cache (shared/cache): answers kept per agent (its least
    # recently used go first; 0: none kept), and how long an answer serves when the
    # agent's policy sets no `cache_ttl`; both written to `owner_settings` by `migrate`
    # and `up`, where the database's functions read them. Off for every agent until it
    # opts in: `agent set NAME cache=on`.
    answer_cache_max_per_agent: Annotated[int, env("ANSWER_CACHE_MAX_PER_AGENT")] = 1000
    answer_cache_ttl: Annotated[float, env("ANSWER_CACHE_TTL", unit="seconds")] = 86400.0
    # Agent confidence (shared/policy/confidence.py): prior strength, daily decay, divergence
    # bound; the gateway's score refresh and the learning job read the same.
    confidence: Annotated[ConfidenceParams, env_group(
        prior_strength="CONFIDENCE_PRIOR_STRENGTH",
        daily_decay="CONFIDENCE_DAILY_DECAY",
        divergence_bound="CONFIDENCE_DIVERGENCE",
    )] = ConfidenceParams()

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

    @property
    def conversational_model(self) -> str:
        """The conversational slot's model: its own, else the main slot's."""
        return self.model_conversational or self.model_main

    @property
    def llm_backend(self) -> str:
        """The model server every LLM role uses unless told otherwise: "ollama" when
        OLLAMA_HOST is set, else "openai" when OPENAI_BASE_URL is, else "" (none)."""
        return "ollama" if self.ollama_host else "openai" if self.openai_base_url else ""

    def slot_model(self, backend: str, *, conversational: bool) -> str:
        """RC-05: a slot's model on `backend` (the conversational slot falls back to the
        main one). On the OpenAI-compatible server: OPENAI_MODEL_CONVERSATIONAL (that
        slot only), then OPENAI_MODEL, then the OLLAMA_MODEL_NAME* names."""
        if backend == "openai":
            own = self.openai_model_conversational if conversational else ""
            if own or self.openai_model:
                return own or self.openai_model
        return self.conversational_model if conversational else self.model_main

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CommonSettings:
        return read_env(cls, environ)


def nats_servers(url: str) -> list[str]:
    """A `NATS_URL` (one URL or a comma-separated list) as nats.connect's server list."""
    return [part.strip() for part in url.split(",") if part.strip()]
