"""A fake OpenAI-compatible model server that fails on demand, in the real wire format.

The MODEL NAME picks what it does (`FAULTS`): every answer is the same known text of
`WORDS` words (`ANSWER`: "word1 word2 ... word60"), so a caller can tell a complete
answer from a truncated one (`is_complete`). The wire is OpenAI's: `POST
/v1/chat/completions` streamed as server-sent events (`chat.completion.chunk` objects,
the last with its `finish_reason`, a usage chunk when `stream_options.include_usage`,
then `data: [DONE]`), or with `"stream": false` one `chat.completion` object; `GET
/v1/models`; errors with OpenAI's body `{"error": {"message", "type", "param",
"code"}}` and its headers (Retry-After on a 429 that says when).

    ok              the answer
    cut-40          40 words, then the connection is aborted (no finish, no [DONE])
    stall           20 words, then silence (held until the caller leaves)
    reset           the connection closed before any byte
    silent          the request read, never answered
    slow-ttft       headers at once, the first word after `slow_ttft_s`
    429-retry       429 with Retry-After: 1, then (the next request) the answer
    429             429 without Retry-After, every time
    503             503 (overloaded), every time
    500-once        500, then (the next request) the answer
    500             500, every time
    malformed       one malformed chunk in the middle (an extra one), then the rest
    no-done         the answer, then the stream ends: no finish_reason, no [DONE]
    context-length  400 context_length_exceeded
    content-filter  400 content_filter (the prompt refused)
    content-filter-mid  20 words, then finish_reason "content_filter"
    prefill-reject  400 when the last message is an assistant prefill, else the answer
    flap            503 while the provider is down (`go_down`), else the answer

A prefill (the last message's role is `assistant`) is continued: the answer is the rest
of the words after the prefill's own (a model that continues one). "429-retry" and
"500-once" alternate per request (the same model and messages: a retry of it): a
failure, then an answer, then a failure, ...

Every request is recorded (`calls`). In tests: `async with FaultProvider() as p:` (a free
loopback port; `p.base_url`). As a process for a demo or a benchmark:
`python -m testkit.fault_provider --port N` (it prints a fleet file's backend section).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Self

from aiohttp import web

from testkit.loopback import serve_on_loopback

WORDS = 60
CUT_AFTER = 40
STALL_AFTER = 20
FILTER_AFTER = 20
PIECES = tuple(("" if n == 1 else " ") + f"word{n}" for n in range(1, WORDS + 1))
ANSWER = "".join(PIECES)

FAULTS = ("ok", "cut-40", "stall", "reset", "silent", "slow-ttft", "429-retry", "429",
          "503", "500-once", "500", "malformed", "no-done", "context-length",
          "content-filter", "prefill-reject", "flap")
# Variants beyond the list above.
EXTRA = ("content-filter-mid",)


def is_complete(text: str) -> bool:
    """The provider's whole answer, whitespace aside."""
    return text.split() == ANSWER.split()


def _error(message: str, kind: str | None, code: str | None,
           param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


RATE_LIMITED = _error(
    "Rate limit reached for requests per min (RPM): Limit 3, Used 3, Requested 1. "
    "Please try again in 1s.", "requests", "rate_limit_exceeded")
RATE_LIMITED_NO_HINT = _error(
    "You exceeded your current quota, please check your plan and billing details.",
    "insufficient_quota", "rate_limit_exceeded")
OVERLOADED = _error("The engine is currently overloaded, please try again later.",
                    "server_error", None)
SERVER_ERROR = _error("The server had an error while processing your request. Sorry "
                      "about that!", "server_error", None)
CONTEXT_LENGTH = _error(
    "This model's maximum context length is 4096 tokens. However, your messages "
    "resulted in 9000 tokens. Please reduce the length of the messages.",
    "invalid_request_error", "context_length_exceeded", "messages")
CONTENT_FILTER = _error(
    "The response was filtered due to the prompt triggering the content management "
    "policy. Please modify your prompt and retry.", "invalid_request_error",
    "content_filter", "prompt")
PREFILL_REFUSED = _error(
    "This model does not support assistant message prefill. The conversation must end "
    "with a user message.", "invalid_request_error", None, "messages")
UNAVAILABLE = _error("upstream connect error or disconnect/reset before headers. "
                     "reset reason: connection failure", "server_error", None)


@dataclass(frozen=True)
class Call:
    """One request as the provider saw it: the model (the fault), whether streamed, the
    words of its prefill (-1: none), what it was answered (an HTTP status, or "reset",
    "cut", "stall", "silent"), when (monotonic seconds)."""

    model: str
    stream: bool
    prefill_words: int
    outcome: str
    at: float
    body: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)


@dataclass
class FaultProvider:
    host: str = "127.0.0.1"
    port: int = 0
    # Seconds before the first word of "slow-ttft"; between two words of every answer.
    slow_ttft_s: float = 2.0
    token_delay: float = 0.0
    calls: list[Call] = field(default_factory=list)
    # Monotonic time until which "flap" is down (0: up); when it last came back up.
    down_until: float = 0.0
    _owed: dict[str, bool] = field(default_factory=dict)
    _closing: asyncio.Event = field(default_factory=asyncio.Event)
    _runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def count(self, model: str | None = None, *, since: float = 0.0) -> int:
        """Requests for `model` (None: any) since the monotonic time `since`."""
        return sum(1 for c in self.calls
                   if (model is None or c.model == model) and c.at >= since)

    # ------------------------------------------------------------------ flapping

    def go_down(self, seconds: float) -> None:
        """"flap" answers 503 for the next `seconds` seconds."""
        self.down_until = time.monotonic() + seconds

    def go_up(self) -> None:
        self.down_until = 0.0

    @property
    def down(self) -> bool:
        return time.monotonic() < self.down_until

    # ------------------------------------------------------------------ serving

    async def start(self) -> Self:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/_control/flap", self._flap)
        self._closing = asyncio.Event()
        self._runner, self.port = await serve_on_loopback(
            app, port=self.port, host=self.host, handler_cancellation=True,
            shutdown_timeout=1.0)
        return self

    async def stop(self) -> None:
        self._closing.set()  # held answers (stall, silent, slow) end now
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "created": 1700000000, "owned_by": "faults"}
            for name in (*FAULTS, *EXTRA)]})

    async def _flap(self, request: web.Request) -> web.Response:
        """`{"down_s": N}`: "flap" down for N seconds (0: up now)."""
        body = await request.json()
        seconds = float(body.get("down_s", 0))
        if seconds > 0:
            self.go_down(seconds)
        else:
            self.go_up()
        return web.json_response({"down": self.down})

    async def _hold(self, request: web.Request, seconds: float) -> bool:
        """Wait `seconds`; False when the provider closes or the caller left first."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            transport = request.transport
            if transport is None or transport.is_closing():
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), min(left, 0.05))
            if self._closing.is_set():
                return False
        return True

    def _record(self, model: str, body: dict[str, Any], prefill: int, outcome: str) -> None:
        self.calls.append(Call(model, bool(body.get("stream")), prefill, outcome,
                               time.monotonic(), body))

    def _alternate(self, model: str, messages: list[Any]) -> bool:
        """True when this request of an alternating fault fails: the same request (the
        same model and messages: a retry) is answered the next time."""
        key = f"{model}\n{json.dumps(messages, sort_keys=True)}"
        owed = self._owed.get(key, False)
        self._owed[key] = not owed
        return not owed

    def _refusal(self, model: str, messages: list[Any],
                 prefill: int) -> tuple[int, dict[str, Any], dict[str, str]] | None:
        """An error answer the fault gives before any byte of an answer (None: none)."""
        refusals: dict[str, tuple[int, dict[str, Any], dict[str, str]]] = {
            "429": (429, RATE_LIMITED_NO_HINT, {}),
            "503": (503, OVERLOADED, {}),
            "500": (500, SERVER_ERROR, {}),
            "context-length": (400, CONTEXT_LENGTH, {}),
            "content-filter": (400, CONTENT_FILTER, {}),
        }
        if model in refusals:
            return refusals[model]
        if model == "429-retry" and self._alternate(model, messages):
            return 429, RATE_LIMITED, {"Retry-After": "1"}
        if model == "500-once" and self._alternate(model, messages):
            return 500, SERVER_ERROR, {}
        if model == "prefill-reject" and prefill >= 0:
            return 400, PREFILL_REFUSED, {}
        if model == "flap" and self.down:
            return 503, UNAVAILABLE, {}
        return None

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        model = str(body.get("model", ""))
        messages = body.get("messages") or []
        prefill = (len(str(messages[-1].get("content", "")).split())
                   if messages and messages[-1].get("role") == "assistant" else -1)
        if model not in FAULTS and model not in EXTRA:
            self._record(model, body, prefill, "404")
            return web.json_response(_error(
                f"The model `{model}` does not exist or you do not have access to it.",
                "invalid_request_error", "model_not_found"), status=404)
        refused = self._refusal(model, messages, prefill)
        if refused is not None:
            status, error, headers = refused
            self._record(model, body, prefill, str(status))
            return web.json_response(error, status=status,
                                     headers={"x-request-id": _request_id(), **headers})
        if model == "reset":
            self._record(model, body, prefill, "reset")
            return _abort(request)
        if model == "silent":
            self._record(model, body, prefill, "silent")
            await self._hold(request, 3600)
            return _abort(request)
        self._record(model, body, prefill, {"cut-40": "cut", "stall": "stall"}.get(model, "200"))
        if not body.get("stream"):  # OpenAI's default: one `chat.completion`
            return await self._completion(request, model, body, max(prefill, 0))
        return await self._stream(request, model, body, max(prefill, 0))

    async def _stream(self, request: web.Request, model: str, body: dict[str, Any],
                      skip: int) -> web.StreamResponse:
        resp = web.StreamResponse(headers={
            "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
            "x-request-id": _request_id(), "openai-processing-ms": "12"})
        await resp.prepare(request)
        chunk = _Chunker(model, usage=bool((body.get("stream_options") or {})
                                           .get("include_usage")))
        await resp.write(chunk.event({"role": "assistant", "content": ""}))
        if model == "slow-ttft" and not await self._hold(request, self.slow_ttft_s):
            return _abort(request)
        stop = {"cut-40": CUT_AFTER, "stall": STALL_AFTER,
                "content-filter-mid": FILTER_AFTER}.get(model, WORDS)
        sent = 0
        for n in range(skip, WORDS):
            if n >= stop:
                break
            if model == "malformed" and n == WORDS // 2:
                await resp.write(b'data: {"id": "chatcmpl-broken", "choices": [{"delta": '
                                 b'{"content": "\n\n')
            await resp.write(chunk.event({"content": PIECES[n]}))
            sent += 1
            if self.token_delay and not await self._hold(request, self.token_delay):
                return _abort(request)
        if model == "cut-40":
            return _abort(request)
        if model == "stall":
            await self._hold(request, 3600)
            return _abort(request)
        if model == "no-done":
            await resp.write_eof()
            return resp
        finish = "content_filter" if model == "content-filter-mid" else "stop"
        await resp.write(chunk.event({}, finish=finish))
        if chunk.usage:
            await resp.write(chunk.usage_event(_prompt_tokens(body), sent))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _completion(self, request: web.Request, model: str, body: dict[str, Any],
                          skip: int) -> web.StreamResponse:
        """A non-streamed answer: the fault's words in one `chat.completion` (a
        constrained request, `response_format` with a JSON schema, gets the schema's
        first allowed value); a cut is a body dropped half way, a stall one held."""
        if model == "slow-ttft" and not await self._hold(request, self.slow_ttft_s):
            return _abort(request)
        content = _constrained(body)
        finish = "stop"
        if content is None:
            end = FILTER_AFTER if model == "content-filter-mid" else WORDS
            content = "".join(PIECES[skip:end]).lstrip() if skip < end else ""
        if model == "content-filter-mid":
            finish = "content_filter"
        words = len(content.split())
        payload = json.dumps({
            "id": f"chatcmpl-{_request_id()}", "object": "chat.completion",
            "created": int(time.time()), "model": model, "system_fingerprint": None,
            "choices": [{"index": 0, "logprobs": None, "finish_reason": finish,
                         "message": {"role": "assistant", "refusal": None,
                                     "content": content}}],
            "usage": {"prompt_tokens": _prompt_tokens(body), "completion_tokens": words,
                      "total_tokens": _prompt_tokens(body) + words}}).encode()
        if model in ("cut-40", "stall"):
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.content_length = len(payload)
            await resp.prepare(request)
            await resp.write(payload[:len(payload) // 2])
            if model == "stall":
                await self._hold(request, 3600)
            return _abort(request)
        if model == "malformed":
            payload = payload[:len(payload) // 2]
        return web.Response(body=payload, content_type="application/json",
                            headers={"x-request-id": _request_id()})


class _Chunker:
    """The `chat.completion.chunk` events of one answer."""

    def __init__(self, model: str, *, usage: bool) -> None:
        self.base = {"id": f"chatcmpl-{_request_id()}", "object": "chat.completion.chunk",
                     "created": int(time.time()), "model": model,
                     "system_fingerprint": "fp_faults"}
        self.usage = usage

    def event(self, delta: dict[str, Any], *, finish: str | None = None) -> bytes:
        data = {**self.base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                          "finish_reason": finish}]}
        if self.usage:
            data["usage"] = None
        return f"data: {json.dumps(data)}\n\n".encode()

    def usage_event(self, prompt: int, completion: int) -> bytes:
        data = {**self.base, "choices": [], "usage": {
            "prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}}
        return f"data: {json.dumps(data)}\n\n".encode()


def _abort(request: web.Request) -> web.StreamResponse:
    """Drop the connection at once (no more bytes, no end of the chunked body)."""
    if request.transport is not None:
        request.transport.abort()
    # aiohttp sees a closed transport and writes nothing more of this response.
    raise asyncio.CancelledError


def _request_id() -> str:
    return uuid.uuid4().hex[:24]


def _prompt_tokens(body: dict[str, Any]) -> int:
    return sum(len(str(m.get("content", "")).split()) for m in body.get("messages") or [])


def _constrained(body: dict[str, Any]) -> str | None:
    """The first allowed value of a strict JSON schema's one enum property, as JSON (a
    label request: Layer 3, the relevance judge), None for a free answer."""
    fmt = body.get("response_format") or {}
    schema = (fmt.get("json_schema") or {}).get("schema") or {}
    for name, prop in (schema.get("properties") or {}).items():
        if prop.get("enum"):
            return json.dumps({name: prop["enum"][0]})
    return None


def fleet_section(name: str, base_url: str, *, prefill: bool = True) -> str:
    """A fleet file's backend section serving every fault as a model."""
    lines = [f"[backends.{name}]", 'kind = "openai"', f'url = "{base_url}"']
    for model in (*FAULTS, *EXTRA):
        lines.append(f'[backends.{name}.models."{model}"]')
        lines.append(f"prefill = {'true' if prefill else 'false'}")
    return "\n".join(lines) + "\n"


async def _serve(args: argparse.Namespace) -> None:
    provider = FaultProvider(host=args.host, port=args.port, slow_ttft_s=args.slow_ttft,
                             token_delay=args.token_delay)
    await provider.start()
    if args.flap_down:
        provider.go_down(args.flap_down)
    print(f"fault provider on {provider.base_url} (models: {', '.join((*FAULTS, *EXTRA))})")
    print("a fleet file's backend for it (LLM_FLEET):\n")
    print(fleet_section("faults", provider.base_url), flush=True)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopped.set)
    await stopped.wait()
    await provider.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m testkit.fault_provider",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--slow-ttft", type=float, default=2.0,
                        help="seconds before the first word of model slow-ttft")
    parser.add_argument("--token-delay", type=float, default=0.0,
                        help="seconds between two words of an answer")
    parser.add_argument("--flap-down", type=float, default=0.0,
                        help="model flap answers 503 for this many seconds from the start "
                             "(later: POST /_control/flap {\"down_s\": N})")
    asyncio.run(_serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
