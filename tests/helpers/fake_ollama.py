"""A fake Ollama HTTP server speaking Ollama's real streaming format (NDJSON on
/api/chat), recording every request, for tests at the edge of the system."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

Responder = Callable[[dict[str, Any]], list[str]]


def _default(body: dict[str, Any]) -> list[str]:
    last = body["messages"][-1]["content"]
    return ["Model ", "answer ", "to: ", last[:40]]


@dataclass
class FakeOllama:
    responder: Responder = _default
    token_delay: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    first_token_sent: asyncio.Event = field(default_factory=asyncio.Event)
    _runner: web.AppRunner | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def models(self) -> list[str]:
        return [r["model"] for r in self.requests]

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        tokens = self.responder(body)
        created = datetime.now(UTC).isoformat()
        if not body.get("stream", True):
            return web.json_response({
                "model": body["model"], "created_at": created,
                "message": {"role": "assistant", "content": "".join(tokens)},
                "done": True, "done_reason": "stop",
            })
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        for token in tokens:
            line = {"model": body["model"], "created_at": created,
                    "message": {"role": "assistant", "content": token}, "done": False}
            await resp.write((json.dumps(line) + "\n").encode())
            self.first_token_sent.set()
            if self.token_delay:
                await asyncio.sleep(self.token_delay)
        done = {"model": body["model"], "created_at": created,
                "message": {"role": "assistant", "content": ""}, "done": True,
                "done_reason": "stop", "total_duration": 1000, "load_duration": 10,
                "prompt_eval_count": 10, "prompt_eval_duration": 100, "eval_count": len(tokens),
                "eval_duration": 500}
        await resp.write((json.dumps(done) + "\n").encode())
        await resp.write_eof()
        return resp

    async def start(self) -> FakeOllama:
        app = web.Application()
        app.router.add_post("/api/chat", self._chat)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()
