"""The doors' settings, read from the environment here only (the dashboard's and the
throttle's defaults nest here). The variables keep the names they had when the doors
were the gateway's (GATEWAY_*): a deployment's configuration reads the same."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import msgspec

from services.doors.dashboard.settings import DashboardSettings
from services.doors.throttle import DEFAULT_AUTH_FAILURES, DEFAULT_AUTH_HASHES, DEFAULT_BODY_RATE
from shared.common.settings import CommonSettings, env, read_env


def _unless_off(value: str) -> str:
    """The value, or "" for off (empty or "off")."""
    value = value.strip()
    return "" if value.lower() == "off" else value


class DoorsSettings(msgspec.Struct, frozen=True, kw_only=True):
    common: CommonSettings
    # gRPC AskAgent / AskAgentStream / Feedback listener; empty host:port disables it.
    grpc_listen: Annotated[str, env("GATEWAY_GRPC_LISTEN")] = ""
    # Seconds a door follows an answer before it gives up (DEADLINE_EXCEEDED).
    answer_timeout: Annotated[float, env("GATEWAY_ANSWER_TIMEOUT")] = 120.0
    # TLS for the gRPC listener (both set: TLS; neither: plain text).
    tls_cert: Annotated[Path | None, env("GATEWAY_TLS_CERT")] = None
    tls_key: Annotated[Path | None, env("GATEWAY_TLS_KEY")] = None
    # HTTP listener (POST /agents/{agent_id}/feedback, the OpenAI-compatible door, the
    # dashboard, /healthz, /readyz); "" or "off" disables it.
    http_listen: Annotated[str, env("GATEWAY_HTTP_LISTEN", parse=_unless_off)] = ""
    # The operator dashboard on the HTTP listener (off without GATEWAY_DASHBOARD_TOKEN).
    dashboard: DashboardSettings = DashboardSettings()
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

    @property
    def tls(self) -> tuple[bytes, bytes] | None:
        """(private key, certificate chain) in PEM for the gRPC listener, or None."""
        if self.tls_cert and self.tls_key:
            return self.tls_key.read_bytes(), self.tls_cert.read_bytes()
        return None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DoorsSettings:
        return read_env(cls, environ, common=CommonSettings.from_env(environ),
                        dashboard=DashboardSettings.from_env(environ))
