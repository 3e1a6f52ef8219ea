"""A fake Ollama HTTP server speaking Ollama's real streaming format (NDJSON on
/api/chat), recording every request, for tests at the edge of the system.

Like Ollama, the last message of a stream (and a non-streamed answer) carries the
call's counts: `prompt_eval_count` (here: the words of the prompt's messages) and
`eval_count` (the pieces streamed); `reported` keeps what was sent. Failures on demand:
a model in `missing` is answered 404 as Ollama answers a model it does not have, and a
model in `fail_after` streams that many pieces, then an error line, as Ollama reports
a failure in the middle of a stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from testkit.loopback import serve_on_loopback

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
    missing: set[str] = field(default_factory=set)
    fail_after: dict[str, int] = field(default_factory=dict)
    # (model, prompt_eval_count, eval_count) of every call that finished.
    reported: list[tuple[str, int, int]] = field(default_factory=list)
    _runner: web.AppRunner | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def models(self) -> list[str]:
        return [r["model"] for r in self.requests]

    @staticmethod
    def prompt_tokens(body: dict[str, Any]) -> int:
        return sum(len(m["content"].split()) for m in body["messages"])

    def _counts(self, body: dict[str, Any], tokens: list[str]) -> dict[str, Any]:
        prompt = self.prompt_tokens(body)
        self.reported.append((body["model"], prompt, len(tokens)))
        return {"done": True, "done_reason": "stop", "total_duration": 1000,
                "load_duration": 10, "prompt_eval_count": prompt, "prompt_eval_duration": 100,
                "eval_count": len(tokens), "eval_duration": 500}

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        model = body["model"]
        if model in self.missing:
            return web.json_response(
                {"error": f'model "{model}" not found, try pulling it first'}, status=404)
        tokens = self.responder(body)
        created = datetime.now(UTC).isoformat()
        if not body.get("stream", True):
            return web.json_response({
                "model": model, "created_at": created,
                "message": {"role": "assistant", "content": "".join(tokens)},
                **self._counts(body, tokens),
            })
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        fail_after = self.fail_after.get(model)
        for i, token in enumerate(tokens):
            if i == fail_after:
                break
            line = {"model": model, "created_at": created,
                    "message": {"role": "assistant", "content": token}, "done": False}
            await resp.write((json.dumps(line) + "\n").encode())
            self.first_token_sent.set()
            if self.token_delay:
                await asyncio.sleep(self.token_delay)
        if fail_after is not None:
            await resp.write(b'{"error":"an error was encountered while running the model"}\n')
        else:
            done = {"model": model, "created_at": created,
                    "message": {"role": "assistant", "content": ""}, **self._counts(body, tokens)}
            await resp.write((json.dumps(done) + "\n").encode())
        await resp.write_eof()
        return resp

    async def _version(self, _: web.Request) -> web.Response:
        return web.json_response({"version": "fake"})

    async def start(self) -> FakeOllama:
        app = web.Application()
        app.router.add_post("/api/chat", self._chat)
        # What the generator's start-up probe asks (a real Ollama answers it too).
        app.router.add_get("/api/version", self._version)
        self._runner, self.port = await serve_on_loopback(app)
        return self

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()
