"""A fake OpenAI server speaking the real wire format under `/v1`, as the OpenAI SDK's
`OPENAI_BASE_URL` (`https://api.openai.com/v1`) addresses it: `POST /v1/chat/completions`
streamed as server-sent events (`chat.completion.chunk` objects, a final usage chunk
when `stream_options.include_usage` is set, then `data: [DONE]`), or with `"stream":
false` as one `chat.completion` object, and `GET /v1/models`;
both refuse a wrong bearer key with OpenAI's 401 body. Every request is recorded."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.helpers.fake_ollama import serve_on_loopback

_BAD_KEY = {"error": {"message": "Incorrect API key provided: no-such-key.",
                      "type": "invalid_request_error", "param": None,
                      "code": "invalid_api_key"}}
_SERVER_ERROR = {"error": {"message": "The server had an error while processing your "
                                      "request. Sorry about that!",
                           "type": "server_error", "param": None, "code": None}}


@dataclass
class FakeOpenAI:
    api_key: str = "sk-test"
    models: list[str] = field(default_factory=lambda: ["gpt-test", "gpt-test-mini"])
    pieces: list[str] = field(default_factory=lambda: ["Hello", " from", " the", " model"])
    # Every request answered with this status and OpenAI's error body (500: a server
    # error), once the key is checked.
    fail_status: int | None = None
    # (method, path) of every request, and the chat requests' bodies.
    seen: list[tuple[str, str]] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _refused(self, request: web.Request) -> web.Response | None:
        self.seen.append((request.method, request.path))
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response(_BAD_KEY, status=401)
        if self.fail_status is not None:
            return web.json_response(_SERVER_ERROR, status=self.fail_status)
        return None

    async def _models(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused:
            return refused
        return web.json_response({"object": "list", "data": [
            {"id": m, "object": "model", "created": 1700000000, "owned_by": "test"}
            for m in self.models]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        refused = self._refused(request)
        if refused:
            return refused
        body = await request.json()
        self.bodies.append(body)
        if body["model"] not in self.models:
            return web.json_response({"error": {
                "message": f"The model `{body['model']}` does not exist",
                "type": "invalid_request_error", "param": None,
                "code": "model_not_found"}}, status=404)
        if body.get("stream") is False:
            return web.json_response(self._completion(body))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk",
                "created": 1700000000, "model": body["model"], "system_fingerprint": None}
        first = [{"index": 0, "delta": {"role": "assistant", "content": ""},
                  "logprobs": None, "finish_reason": None}]
        events: list[dict[str, Any]] = [{**base, "choices": first}]
        events += [{**base, "choices": [{"index": 0, "delta": {"content": piece},
                                         "logprobs": None, "finish_reason": None}]}
                   for piece in self.pieces]
        events.append({**base, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                            "finish_reason": "stop"}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append({**base, "choices": [], "usage": {
                "prompt_tokens": 11, "completion_tokens": len(self.pieces),
                "total_tokens": 11 + len(self.pieces)}})
        for event in events:
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """A non-streamed answer: one `chat.completion` object with the pieces joined."""
        return {"id": "chatcmpl-2", "object": "chat.completion", "created": 1700000000,
                "model": body["model"], "system_fingerprint": None,
                "choices": [{"index": 0, "logprobs": None, "finish_reason": "stop",
                             "message": {"role": "assistant", "refusal": None,
                                         "content": "".join(self.pieces)}}],
                "usage": {"prompt_tokens": 11, "completion_tokens": len(self.pieces),
                          "total_tokens": 11 + len(self.pieces)}}

    async def start(self) -> FakeOpenAI:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner, self.port = await serve_on_loopback(app)
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
