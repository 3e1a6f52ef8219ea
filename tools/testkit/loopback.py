"""An aiohttp app served on loopback on a free port (the fake model servers)."""

from __future__ import annotations

from typing import Any

from aiohttp import web


async def serve_on_loopback(app: web.Application, *, port: int = 0,
                            host: str = "127.0.0.1",
                            **runner: Any) -> tuple[web.AppRunner, int]:
    """`app` served on `host` on `port` (0: a free one): its runner (to clean up) and
    the port. `runner` goes to `web.AppRunner` (`handler_cancellation`,
    `shutdown_timeout`)."""
    app_runner = web.AppRunner(app, **runner)
    await app_runner.setup()
    site = web.TCPSite(app_runner, host, port)
    await site.start()
    return app_runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
