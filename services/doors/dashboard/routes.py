"""The dashboard's HTTP routes on the doors' aiohttp application.

    GET  {prefix}                 the page (the login form, 401, without a session)
    POST {prefix}/login           form field `token` -> session cookie, 303 to the page
    POST {prefix}/logout          clears the cookie
    GET  {prefix}/login/{token}   a one-time login link (link_login), with a folder of links
    GET  {prefix}/api/data        the figures as JSON (?days=N&until=YYYY-MM-DD); the page
                                  renders from it; cookie or `Authorization: Bearer`
    GET  {prefix}/api/stages      each stage's lag, errors, rate and p95 now (as
                                  `intentroute status`); 503 when the bus does not answer,
                                  404 without a bus connection
    GET  {prefix}/static/NAME     the page's script, style and the vendored Chart.js

Without a configured token none of them exist (404). Every response forbids framing
and inline scripts; figures are never cached. The page asks for both again every
`refresh` seconds (GATEWAY_DASHBOARD_REFRESH) and says when its figures were read."""

from __future__ import annotations

import datetime as dt
import html
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import msgspec
from aiohttp import web
from nats.aio.client import Client

from services.doors.dashboard.auth import COOKIE, session_cookie, session_valid, token_matches
from services.doors.dashboard.figures import build_dashboard
from services.doors.dashboard.link_login import add_link_login
from services.doors.dashboard.queries import FiguresUnavailableError, read_figures
from services.doors.dashboard.rows import Window
from services.doors.dashboard.stages import StageReader, StagesUnavailableError
from services.doors.log_budget import LogBudget
from services.doors.throttle import DEFAULT_AUTH_FAILURES, AuthThrottle, ThrottledError
from shared.auth.identity import bearer_value
from shared.auth.login_links import LoginLinks

log = logging.getLogger("intentroute.doors.dashboard")

STATIC_DIR = Path(__file__).resolve().parent / "static"
_STATIC_TYPES = {
    "chart.umd.js": "text/javascript",
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
}
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
        " connect-src 'self'; form-action 'self'; base-uri 'self'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
_NO_STORE = {**_HEADERS, "Cache-Control": "no-store"}
Handler = Callable[[web.Request], Awaitable[web.Response]]
# The right token is let in from any address, however many wrong ones came from there
# (services/doors/throttle.py), so the throttle does not stop guessing: the token's
# length does. 32 characters of hex are 128 bits; `up` generates 43 of base64 (256).
MIN_TOKEN = 32


def _guarded(handler: Handler) -> Handler:
    """429 for a wrong token from an address that presented too many lately."""
    async def run(request: web.Request) -> web.Response:
        try:
            return await handler(request)
        except ThrottledError as exc:
            return web.Response(text=str(exc), status=429,
                                headers={**_NO_STORE, "Retry-After": str(exc.retry_after)})
    return run


class _Dashboard:
    def __init__(self, pool: asyncpg.Pool, *, token: str, prefix: str, default_days: int,
                 max_days: int, session_ttl: float, clock: Callable[[], float],
                 throttle: AuthThrottle, refresh: float, stages: StageReader | None
                 ) -> None:
        self.pool = pool
        self.stages = stages
        self.token = token
        self.throttle = throttle
        self.prefix = prefix
        self.default_days = default_days
        self.max_days = max_days
        self.session_ttl = session_ttl
        self.clock = clock
        self.refusals = LogBudget(log)
        base = html.escape(prefix + "/", quote=True)
        self.page_html = (STATIC_DIR / "index.html").read_text("utf-8").replace(
            "{{BASE}}", base).replace("{{REFRESH}}", f"{max(0.0, refresh):g}").replace(
            "{{STAGES}}", "1" if stages is not None else "0")
        self.login_template = (STATIC_DIR / "login.html").read_text("utf-8").replace(
            "{{BASE}}", base)
        self.static = {name: (STATIC_DIR / name).read_bytes() for name in _STATIC_TYPES}

    def _token_ok(self, request: web.Request, given: str) -> bool:
        """Is a presented token the dashboard's (always checked: the right one is let in
        from any address)? A wrong one counts against the caller's address;
        ThrottledError once it has presented too many."""
        if token_matches(self.token, given):
            return True
        self.throttle.failed(request.remote or "")
        return False

    def authorized(self, request: web.Request) -> bool:
        """A valid session cookie or the right bearer token (a valid session is never
        refused for a wrong bearer token beside it)."""
        cookie = request.cookies.get(COOKIE, "")
        if cookie and session_valid(self.token, cookie, now=self.clock()):
            return True
        given = bearer_value(request.headers.get("Authorization", "").strip())
        return bool(given) and self._token_ok(request, given)

    def _login_form(self, message: str, status: int) -> web.Response:
        body = self.login_template.replace("{{MESSAGE}}", html.escape(message))
        return web.Response(text=body, status=status, content_type="text/html",
                            headers={**_NO_STORE, "WWW-Authenticate": 'Bearer realm="dashboard"'})

    async def page(self, request: web.Request) -> web.Response:
        if not self.authorized(request):
            return self._login_form("", 401)
        return web.Response(text=self.page_html, content_type="text/html", headers=_NO_STORE)

    async def login(self, request: web.Request) -> web.Response:
        try:
            form = await request.post()
        except (ValueError, LookupError):
            # A form that does not parse (multipart without its boundary, an unknown
            # charset, bytes not of it): the caller's error, not the door's.
            return self._login_form("The form could not be read.", 400)
        given = form.get("token")
        if not isinstance(given, str) or not self._token_ok(request, given):
            self.refusals.warning(request.remote or "", "dashboard: refused a login from %s",
                                  request.remote)
            return self._login_form("Wrong token.", 401)
        return self.logged_in(request)

    def logged_in(self, request: web.Request) -> web.Response:
        """The session cookie, and a 303 to the page (a login, or a one-time link)."""
        response = web.Response(status=303, headers={**_NO_STORE, "Location": self.prefix})
        response.set_cookie(
            COOKIE, session_cookie(self.token, now=self.clock(), ttl=self.session_ttl),
            max_age=int(self.session_ttl), path=self.prefix, httponly=True,
            samesite="Strict", secure=request.secure)
        return response

    async def logout(self, request: web.Request) -> web.Response:
        response = web.Response(status=303, headers={**_NO_STORE, "Location": self.prefix})
        response.del_cookie(COOKIE, path=self.prefix)
        return response

    def window(self, request: web.Request) -> Window:
        """The requested window of UTC days; a bad parameter -> 400 with the reason."""
        try:
            days = int(request.query.get("days", self.default_days))
            until_text = request.query.get("until", "")
            until = (dt.date.fromisoformat(until_text) if until_text
                     else dt.datetime.fromtimestamp(self.clock(), dt.UTC).date())
        except ValueError as exc:
            raise web.HTTPBadRequest(text=f"bad days/until: {exc}", headers=_NO_STORE) from None
        if not 1 <= days <= self.max_days:
            raise web.HTTPBadRequest(text=f"days must be in 1..{self.max_days}",
                                     headers=_NO_STORE)
        return Window.ending(until, days)

    async def data(self, request: web.Request) -> web.Response:
        if not self.authorized(request):
            return web.json_response({"error": "dashboard token required"}, status=401,
                                     headers={**_NO_STORE,
                                              "WWW-Authenticate": 'Bearer realm="dashboard"'})
        window = self.window(request)
        try:
            figures = await read_figures(self.pool, window)
        except FiguresUnavailableError as exc:
            log.error("dashboard: figures unavailable: %s", exc)
            return web.json_response({"error": "figures unavailable, try again"},
                                     status=503, headers=_NO_STORE)
        dashboard = build_dashboard(window, figures)
        return web.Response(body=msgspec.json.encode(dashboard),
                            content_type="application/json", headers=_NO_STORE)

    async def stage_figures(self, request: web.Request) -> web.Response:
        if not self.authorized(request):
            return web.json_response({"error": "dashboard token required"}, status=401,
                                     headers={**_NO_STORE,
                                              "WWW-Authenticate": 'Bearer realm="dashboard"'})
        if self.stages is None:
            return web.json_response({"error": "no bus connection here"}, status=404,
                                     headers=_NO_STORE)
        try:
            view = await self.stages.view()
        except StagesUnavailableError as exc:
            log.warning("dashboard: stage figures unavailable: %s", exc)
            return web.json_response({"error": "stage figures unavailable, try again"},
                                     status=503, headers=_NO_STORE)
        return web.Response(body=msgspec.json.encode(view), content_type="application/json",
                            headers=_NO_STORE)

    async def static_file(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.static:
            raise web.HTTPNotFound()
        return web.Response(body=self.static[name], content_type=_STATIC_TYPES[name],
                            headers={**_HEADERS, "Cache-Control": "max-age=300"})


def add_dashboard_routes(
    app: web.Application,
    pool: asyncpg.Pool,
    *,
    token: str,
    prefix: str = "/dashboard",
    default_days: int = 30,
    max_days: int = 400,
    session_ttl: float = 12 * 3600.0,
    clock: Callable[[], float] = time.time,
    throttle: AuthThrottle | None = None,
    refresh: float = 20.0,
    nc: Client | None = None,
    login_links: str = "",
) -> bool:
    """Add the dashboard under `prefix`; with an empty `token` add nothing (the dashboard
    is off and its URLs answer 404), nor with one shorter than MIN_TOKEN. True when
    added. `refresh`: seconds between the page's readings (0: none); `nc`: the bus
    connection the stage figures are read on (None: no stage figures); `login_links`:
    the folder of one-time login links (link_login; "": none)."""
    if not token:
        log.info("dashboard off: GATEWAY_DASHBOARD_TOKEN is not set")
        return False
    if len(token) < MIN_TOKEN:
        log.error("dashboard off: GATEWAY_DASHBOARD_TOKEN has %d characters, it needs %d "
                  "or more of random (e.g. `openssl rand -hex 32`)", len(token), MIN_TOKEN)
        return False
    prefix = "/" + prefix.strip("/")
    dash = _Dashboard(pool, token=token, prefix=prefix, default_days=default_days,
                      max_days=max_days, session_ttl=session_ttl, clock=clock,
                      throttle=throttle or AuthThrottle(DEFAULT_AUTH_FAILURES),
                      refresh=refresh, stages=StageReader(nc) if nc is not None else None)
    app.router.add_get(prefix, _guarded(dash.page))
    app.router.add_post(prefix + "/login", _guarded(dash.login))
    app.router.add_post(prefix + "/logout", dash.logout)
    app.router.add_get(prefix + "/api/data", _guarded(dash.data))
    app.router.add_get(prefix + "/api/stages", _guarded(dash.stage_figures))
    app.router.add_get(prefix + "/static/{name}", dash.static_file)
    if login_links:
        add_link_login(app, prefix, LoginLinks(Path(login_links)), dash.throttle,
                       logged_in=dash.logged_in, login_form=dash._login_form,
                       guarded=_guarded)
    return True
