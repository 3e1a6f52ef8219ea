from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import msgspec

from shared.settings import CommonSettings, env_float, env_int, env_str


class GatewaySettings(msgspec.Struct, frozen=True, kw_only=True):
    common: CommonSettings
    # gRPC AskAgent / AskAgentStream listener; empty host:port disables it.
    grpc_listen: str = ""
    answer_timeout: float = 120.0
    batch_size: int = 32
    # TLS for the gRPC listener (both set: TLS; neither: plain text).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # Seconds an agent record (trust, revocation, token check) is cached.
    agent_cache_ttl: float = 5.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> GatewaySettings:
        return cls(
            common=CommonSettings.from_env(environ),
            grpc_listen=env_str("GATEWAY_GRPC_LISTEN", "", environ),
            answer_timeout=env_float("GATEWAY_ANSWER_TIMEOUT", 120.0, environ),
            batch_size=env_int("GATEWAY_BATCH", 32, environ),
            tls_cert=_path(env_str("GATEWAY_TLS_CERT", "", environ)),
            tls_key=_path(env_str("GATEWAY_TLS_KEY", "", environ)),
            agent_cache_ttl=env_float("GATEWAY_AGENT_CACHE_TTL", 5.0, environ),
        )


def _path(value: str) -> Path | None:
    return Path(value) if value else None
