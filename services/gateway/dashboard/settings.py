"""Dashboard settings, read from the environment here only (the gateway nests them)."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from shared.common.settings import env_float, env_int, env_str


class DashboardSettings(msgspec.Struct, frozen=True, kw_only=True):
    # Operator token of the dashboard; empty = the dashboard is off (its URLs are 404).
    token: str = ""
    # Days shown when the page does not ask for a window, and the longest window served.
    default_days: int = 30
    max_days: int = 400
    # Seconds a login (the session cookie) stays valid.
    session_ttl: float = 12 * 3600.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DashboardSettings:
        return cls(
            token=env_str("GATEWAY_DASHBOARD_TOKEN", "", environ),
            default_days=env_int("GATEWAY_DASHBOARD_DAYS", 30, environ),
            session_ttl=env_float("GATEWAY_DASHBOARD_SESSION_TTL", 12 * 3600.0, environ),
        )
