"""A pass-through HTTP proxy in front of a real model server, recording each request's
method, path and JSON body: a test sees what a worker sent the real model (the prompt of
a retry, say) while the real model answers, streamed through as it comes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tests.helpers.fake_ollama import serve_on_loopback


@dataclass
class RecordingProxy:
    upstream: str  # the real server's base URL, `/v1` included
    requests: list[tuple[str, str, dict[str, Any] | None]] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def bodies(self, path: str) -> list[dict[str, Any]]:
        """The JSON bodies sent to `path` (under /v1), in order."""
        return [body for _, p, body in self.requests if p == f"/v1/{path}" and body]

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.requests.append((request.method, request.path, json.loads(raw) if raw else None))
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() in ("authorization", "content-type", "accept")}
        url = self.upstream.rstrip("/") + request.path_qs.removeprefix("/v1")
        async with self._session.request(request.method, url, data=raw or None,
                                         headers=headers) as upstream:
            resp = web.StreamResponse(status=upstream.status, headers={
                "Content-Type": upstream.headers.get("Content-Type", "application/json")})
            await resp.prepare(request)
            async for chunk in upstream.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    async def start(self) -> RecordingProxy:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application()
        app.router.add_route("*", "/v1/{tail:.*}", self._forward)
        self._runner, self.port = await serve_on_loopback(app)
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
