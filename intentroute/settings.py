"""The CLI's settings: where the stack runs and where its state lives."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import msgspec

from intentroute.stack.natsconf import DEFAULT_SYNC_INTERVAL, sync_interval_problem
from shared.common.settings import CommonSettings, env_str


class CliSettings(msgspec.Struct, frozen=True, kw_only=True):
    common: CommonSettings
    # Set by the environment only; "" means "start an embedded server" (`up`) or
    # "use the running `intentroute up`" (other commands).
    nats_url: str = ""
    database_url: str = ""
    index_dir: Path = Path(".intentroute/index")
    # TLS for the embedded nats-server: its certificate and key; with a CA the server
    # also verifies client certificates (mutual TLS).
    nats_tls_server_cert: str = ""
    nats_tls_server_key: str = ""
    nats_tls_server_ca: str = ""
    # Reports: the main slot's model (the saving is priced against it) and the key that
    # replaces agent ids with their HMAC (`--hash-agents`): a file, or the value itself.
    main_model: str = ""
    agent_hash_key_file: str = ""
    agent_hash_key: str = ""
    # How often the embedded JetStream fsyncs its store: a duration or "always"
    # (README, Reliability: what a host crash can lose with each).
    nats_sync_interval: str = DEFAULT_SYNC_INTERVAL
    # The bearer token `intentroute llm-server` requires (`up --llm` generates one).
    openai_api_key: str = ""

    @property
    def state_dir(self) -> Path:
        return self.common.state_dir

    def __post_init__(self) -> None:
        problem = sync_interval_problem(self.nats_sync_interval)
        if problem:
            raise ValueError(f"NATS_SYNC_INTERVAL {problem}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CliSettings:
        common = CommonSettings.from_env(environ)
        return cls(
            common=common,
            nats_url=env_str("NATS_URL", "", environ),
            database_url=env_str("DATABASE_URL", "", environ),
            index_dir=Path(env_str("INDEX_DIR", str(common.state_dir / "index"), environ)),
            openai_api_key=env_str("OPENAI_API_KEY", "", environ),
            nats_tls_server_cert=env_str("NATS_TLS_SERVER_CERT", "", environ),
            nats_tls_server_key=env_str("NATS_TLS_SERVER_KEY", "", environ),
            nats_tls_server_ca=env_str("NATS_TLS_SERVER_CA", "", environ),
            main_model=env_str("OLLAMA_MODEL_NAME", "", environ),
            agent_hash_key_file=env_str("AGENT_HASH_KEY_FILE", "", environ),
            agent_hash_key=env_str("AGENT_HASH_KEY", "", environ),
            nats_sync_interval=env_str("NATS_SYNC_INTERVAL", DEFAULT_SYNC_INTERVAL, environ),
        )
