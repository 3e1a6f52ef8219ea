"""The dashboard's one-time login link (shared.auth.login_links):

    GET {prefix}/login/{token}    a link minted by `intentroute up` (its ready screen) or
                                  `intentroute dashboard-link`: the session cookie and a
                                  303 to the page, once; used again, expired or unknown:
                                  the login form, 401, saying so

A refused link counts against the caller's address as a wrong token does (the throttle
answers 429 past its bound). On only when the dashboard has a folder of links
(GATEWAY_DASHBOARD_LOGIN_LINKS)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from services.doors.throttle import AuthThrottle
from shared.auth.login_links import LoginLinks

USED = ("This login link was used already or has expired: log in with the dashboard "
        "token, or get a new link with `intentroute dashboard-link`.")


def add_link_login(
    app: web.Application, prefix: str, links: LoginLinks, throttle: AuthThrottle, *,
    logged_in: Callable[[web.Request], web.Response],
    login_form: Callable[[str, int], web.Response],
    guarded: Callable[[Callable[[web.Request], Awaitable[web.Response]]],
                      Callable[[web.Request], Awaitable[web.Response]]],
) -> None:
    """Serve `{prefix}/login/{token}`: `logged_in` makes the session's response,
    `login_form` the refusal, `guarded` maps the throttle's refusal to 429."""

    async def redeem(request: web.Request) -> web.Response:
        if links.redeem(request.match_info["token"]):
            return logged_in(request)
        throttle.failed(request.remote or "")
        return login_form(USED, 401)

    app.router.add_get(prefix + "/login/{token}", guarded(redeem))
