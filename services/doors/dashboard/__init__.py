"""Operator dashboard, one of the doors (ADR-0006): per agent, traffic by query type and
deciding layer, latency p50/p95 per day, fallback rate, feedback outcomes, cost per day
and SLO breaches, as charts, from `daily_rollups` and `feedback`.

`add_dashboard_routes(app, pool, token=...)` adds it to an aiohttp application; the
doors' HTTP server calls it with `DashboardSettings.from_env()`'s values."""

from services.doors.dashboard.routes import add_dashboard_routes
from services.doors.dashboard.settings import DashboardSettings

__all__ = ["DashboardSettings", "add_dashboard_routes"]
