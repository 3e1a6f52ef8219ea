"""Dashboard settings, read from the environment here only (the doors nest them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

import msgspec

from shared.common.settings import env, read_env, secret_env


class DashboardSettings(msgspec.Struct, frozen=True, kw_only=True):
    # Operator token of the dashboard (or GATEWAY_DASHBOARD_TOKEN_FILE: a file holding
    # it); empty = the dashboard is off (its URLs are 404).
    token: Annotated[str, secret_env("GATEWAY_DASHBOARD_TOKEN")] = ""
    # Days shown when the page does not ask for a window, and the longest window served.
    default_days: Annotated[int, env("GATEWAY_DASHBOARD_DAYS")] = 30
    max_days: int = 400
    # Seconds a login (the session cookie) stays valid.
    session_ttl: Annotated[float, env("GATEWAY_DASHBOARD_SESSION_TTL")] = 12 * 3600.0
    # Seconds between the page's readings of its figures (0: read once, on load). Every
    # reading of a month for 50 agents costs ~0.2 s of Postgres (bench dashboard's
    # dashboard_api_ms), so 20 s keeps an open page under 1% of one core.
    refresh: Annotated[float, env("GATEWAY_DASHBOARD_REFRESH")] = 20.0
    # A folder of one-time login links (shared.auth.login_links): `intentroute up` sets
    # it to <state>/creds/dashboard-links, where its ready screen's link (and
    # `intentroute dashboard-link`'s) is minted; "": no login links.
    login_links: Annotated[str, env("GATEWAY_DASHBOARD_LOGIN_LINKS")] = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DashboardSettings:
        return read_env(cls, environ)
