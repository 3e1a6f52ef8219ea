"""`POST /v1/chat/completions` and `GET /v1/models` on the gateway's HTTP server: the
OpenAI SDK (and whatever speaks its API) as a caller, the agent's token as its API key.

The request is bridged to the pipeline as gRPC's is (bridge.Door: same token check and
throttle, same checks, published on the agent's `agent.request.<agent_id>`), so the
fair share and the per-agent limits apply. A stream's HTTP status is chosen on the
answer's first chunk: a request refused at admission, or answered with an error before
any text, gets its error status and body; an error after text went out is an
`data: {"error": ...}` event (the SDK raises APIError), with no `[DONE]` after it.

Every answer says what the door itself took, in W3C `Server-Timing` (which browsers'
developer tools and most HTTP tooling show): `door` = from the handler's start to the
request handed to the bus, plus (collected answers) from the final chunk to the response;
`pipeline` = the rest, the workers' time. `bench pipeline --door openai` reports both.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

import msgspec
import nats.errors
from aiohttp import web
from msgspec import UNSET, UnsetType

from services.gateway.bridge import Door, is_refusal, retry_after_seconds
from services.gateway.openai_door import wire
from services.gateway.openai_door.wire import Delta, Usage, WireError
from services.gateway.throttle import BodyBudget, ThrottledError
from services.gateway.validation import InputError
from shared.auth.identity import bearer_value
from shared.auth.ports import AgentInfo
from shared.client.answers import RequestInFlightError
from shared.client.caller import AnswerTimeoutError, RequestRefusedError, assemble, is_text
from shared.contracts.request import AgentRequest
from shared.contracts.response import ChunkKind, ErrorCode, ErrorInfo, ResponseChunk

log = logging.getLogger("intentroute.gateway.openai")

CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
SESSION_HEADER = "X-Session-Id"
# A chat request carries the whole conversation at every turn: 2 MiB holds one of
# ~500k characters (a 128k-token context) twice over; the app's own limit is 64 KiB.
MAX_CHAT_BODY = 2 * 1024 * 1024

DOOR_KEY = web.AppKey("openai_door", Door)
BODY_BUDGET_KEY = web.AppKey("openai_body_budget", BodyBudget)
CREATED_KEY = web.AppKey("openai_created", int)

_encode = msgspec.json.Encoder().encode
_DONE = b"data: [DONE]\n\n"


def add_openai_routes(app: web.Application, door: Door,
                      body_budget: BodyBudget | None = None) -> None:
    app[DOOR_KEY] = door
    app[BODY_BUDGET_KEY] = body_budget or BodyBudget()
    app[CREATED_KEY] = int(time.time())
    app.router.add_post(CHAT_PATH, chat_completions)
    app.router.add_get(MODELS_PATH, list_models)
    app.router.add_get(MODELS_PATH + "/{model:.+}", get_model)


def _error(status: int, code: str, message: str, param: str | None = None,
           headers: dict[str, str] | None = None) -> web.Response:
    body = _encode(wire.error_envelope(status, code, message, param))
    return web.Response(body=body, status=status, content_type="application/json",
                        headers=headers)


def _answer_error(error: ErrorInfo, headers: dict[str, str]) -> web.Response:
    """An answer's error as its HTTP error; a refusal with when to ask again (the SDK
    waits `retry-after-ms` before it retries, else `Retry-After`)."""
    if is_refusal(error) and error.retry_after_ms > 0:
        headers = {**headers, "Retry-After": str(retry_after_seconds(error.retry_after_ms)),
                   "retry-after-ms": str(error.retry_after_ms)}
    status, envelope = wire.error_of(error)
    return web.Response(body=_encode(envelope), status=status,
                        content_type="application/json", headers=headers)


# What ends an answer before its final chunk: no final in time, the request stream full,
# NATS failing the publish or the follow (a JetStream ack lost to a paused or restarting
# server: nats.errors.TimeoutError after 5 s, seen with nats-server SIGSTOPped 8 s).
UNANSWERED = (AnswerTimeoutError, RequestRefusedError, nats.errors.Error)


def _unavailable(exc: Exception, headers: dict[str, str]) -> web.Response:
    """The answer did not come (UNANSWERED), as its OpenAI error."""
    if isinstance(exc, RequestRefusedError):
        return _error(429, wire.QUEUE_FULL, str(exc), headers={**headers, "Retry-After": "1"})
    if isinstance(exc, nats.errors.Error):
        return _error(503, wire.BUS_UNAVAILABLE, _bus_failed(exc),
                      headers={**headers, "Retry-After": "1"})
    return _error(504, ErrorCode.DEADLINE_EXCEEDED, str(exc), headers=headers)


def _bus_failed(exc: nats.errors.Error) -> str:
    return f"the message bus failed the request ({type(exc).__name__}: {exc}); ask again"


async def _agent(request: web.Request) -> AgentInfo | web.Response:
    door = request.app[DOOR_KEY]
    token = bearer_value(request.headers.get("Authorization", ""))
    try:
        agent = await door.caller(token, request.remote or "")
    except ThrottledError as exc:
        return _error(429, wire.THROTTLED, str(exc),
                      headers={"Retry-After": str(exc.retry_after)})
    if agent is None:
        return _error(401, wire.UNAUTHENTICATED,
                      "a valid agent token is required as the API key "
                      "(Authorization: Bearer <token>)",
                      headers={"WWW-Authenticate": 'Bearer realm="intentroute"'})
    return agent


async def list_models(request: web.Request) -> web.Response:
    agent = await _agent(request)
    if isinstance(agent, web.Response):
        return agent
    return web.Response(body=_encode(wire.model_list(request.app[CREATED_KEY])),
                        content_type="application/json")


async def get_model(request: web.Request) -> web.Response:
    agent = await _agent(request)
    if isinstance(agent, web.Response):
        return agent
    name = request.match_info["model"]
    for card in wire.model_list(request.app[CREATED_KEY]).data:
        if card.id == name:
            return web.Response(body=_encode(card), content_type="application/json")
    return _error(404, ErrorCode.INVALID_FIELD, f"no model {name!r}", "model")


async def _read(request: web.Request, agent_id: str) -> bytes | web.Response:
    """The body, within the agent's budget of bytes parsed (BodyBudget): its declared
    length is charged before reading, an undeclared one once read."""
    budget = request.app[BODY_BUDGET_KEY]
    declared = request.content_length
    if declared is not None:
        refused = (_too_large() if declared > MAX_CHAT_BODY
                   else _over_budget(budget, agent_id, declared))
        if refused is not None:
            # Closed, not drained: the body refused unread costs nothing more to skip.
            refused.force_close()
            return refused
    try:
        raw = await request.clone(client_max_size=MAX_CHAT_BODY).read()
    except web.HTTPRequestEntityTooLarge:
        return _too_large()
    if declared is None:
        return _over_budget(budget, agent_id, len(raw)) or raw
    return raw


def _too_large() -> web.Response:
    return _error(413, ErrorCode.OVERSIZED_FIELD, f"body exceeds {MAX_CHAT_BODY} bytes")


def _over_budget(budget: BodyBudget, agent_id: str, size: int) -> web.Response | None:
    wait = budget.spend(agent_id, size)
    if not wait:
        return None
    return _error(429, ErrorCode.RATE_LIMITED,
                  f"more request bytes a second than this door parses for one agent; "
                  f"retry in {wait} s", headers={"Retry-After": str(wait),
                                                  "retry-after-ms": str(wait * 1000)})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    agent = await _agent(request)
    if isinstance(agent, web.Response):
        return agent
    raw = await _read(request, agent.agent_id)
    if isinstance(raw, web.Response):
        return raw
    chat = wire.decode_chat(raw)
    if isinstance(chat, WireError):
        return _error(chat.status, chat.code, chat.message, chat.param)
    req = wire.to_agent_request(chat, session_header=request.headers.get(SESSION_HEADER, ""),
                                request_id=uuid.uuid4().hex)
    if isinstance(req, WireError):
        return _error(req.status, req.code, req.message, req.param)
    door = request.app[DOOR_KEY]
    checked = door.check(req, agent.agent_id)
    if isinstance(checked, InputError):
        return _error(wire.status_of(checked.code), checked.code, checked.message)
    ids = wire.headers_of(None, checked.request_id, checked.session_id)
    # The door's span continues the caller's `traceparent` header (bridge.Door).
    answer = door.answer(checked, span_name=f"POST {CHAT_PATH}", carrier=request.headers,
                         attributes={"http.request.method": "POST", "http.route": CHAT_PATH})
    clock = _Clock(started)
    async with aclosing(answer):
        try:
            first = await anext(answer)
        except UNANSWERED as exc:
            return _unavailable(exc, ids)
        except RequestInFlightError as exc:  # nothing was published
            return _error(409, ErrorCode.INVALID_FIELD, str(exc), "intentroute",
                          headers=ids)
        if first.is_final and first.error is not None:
            return _answer_error(first.error, ids)
        if chat.stream:
            return await _stream(request, checked, chat, first, answer, clock)
        return await _collect(checked, chat, first, answer, clock)


class _Clock:
    """The door's own time (`Server-Timing`), apart from the pipeline's: started is the
    handler's start, handed when the request goes to the bus (perf_counter seconds)."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.handed = time.perf_counter()

    def header(self, answered: float | None = None) -> dict[str, str]:
        """`door` (ms): up to the handoff, plus since `answered` (the final chunk in);
        `pipeline` (ms): from the handoff to `answered`."""
        door = self.handed - self.started
        value = ""
        if answered is not None:
            door += time.perf_counter() - answered
            value = f", pipeline;dur={(answered - self.handed) * 1000:.3f}"
        return {"Server-Timing": f"door;dur={door * 1000:.3f}{value}"}


async def _collect(req: AgentRequest, chat: wire.ChatRequest, first: ResponseChunk,
                   answer: AsyncIterator[ResponseChunk], clock: _Clock) -> web.Response:
    chunks = [first]
    try:
        while not chunks[-1].is_final:
            chunks.append(await anext(answer))
    except UNANSWERED as exc:
        return _unavailable(exc, wire.headers_of(None, req.request_id, req.session_id))
    answered = time.perf_counter()
    final = chunks[-1]
    headers = wire.headers_of(final, req.request_id, req.session_id)
    if final.error is not None:
        return _answer_error(final.error, headers)
    body = _encode(wire.completion(final, assemble(chunks), req=req, model=chat.model,
                                   created=int(time.time())))
    return web.Response(body=body, content_type="application/json",
                        headers={**headers, **clock.header(answered)})


class _Events:
    """One answer as server-sent events, as OpenAI streams them."""

    def __init__(self, resp: web.StreamResponse, req: AgentRequest, chat: wire.ChatRequest
                 ) -> None:
        self.resp = resp
        self.req = req
        self.model = chat.model
        self.created = int(time.time())
        self.include_usage = chat.include_usage
        # With include_usage OpenAI sends `"usage": null` on every chunk but the last.
        self.no_usage: UnsetType | None = None if self.include_usage else UNSET

    async def send(self, event: msgspec.Struct) -> None:
        await self.resp.write(b"data: " + _encode(event) + b"\n\n")

    async def delta(self, delta: Delta, finish: str | None = None, *,
                    usage: Usage | UnsetType | None = UNSET,
                    info: wire.RouteInfo | wire.Reset | UnsetType = UNSET) -> None:
        await self.send(wire.chunk(self.req.request_id, self.model, self.created, delta,
                                   finish, usage=self.no_usage if usage is UNSET else usage,
                                   info=info))

    async def relay(self, piece: ResponseChunk) -> None:
        if piece.kind == ChunkKind.RESET:
            await self.delta(Delta(), info=wire.Reset())
        elif is_text(piece) and piece.text:
            await self.delta(Delta(content=piece.text))
        if not piece.is_final:
            return
        if piece.error is not None:
            await self.send(wire.error_of(piece.error)[1])
            return
        usage = wire.usage_of(piece)
        await self.delta(Delta(), "stop", usage=None if self.include_usage else usage,
                         info=wire.route_info(piece, self.req))
        if self.include_usage:
            await self.send(wire.usage_chunk(self.req.request_id, self.model, self.created,
                                             usage))
        await self.resp.write(_DONE)


async def _stream(request: web.Request, req: AgentRequest, chat: wire.ChatRequest,
                  first: ResponseChunk, answer: AsyncIterator[ResponseChunk], clock: _Clock
                  ) -> web.StreamResponse:
    resp = web.StreamResponse(headers={
        **wire.headers_of(None, req.request_id, req.session_id), **clock.header(),
        "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no"})  # nginx and the like: pass each event on at once
    await resp.prepare(request)
    events = _Events(resp, req, chat)
    piece = first
    # A client gone (ConnectionResetError on a write) ends the stream quietly, the
    # error event's write included: a client that left while the pipeline stalled
    # made the door's 504 event a traceback in the log.
    try:
        try:
            await events.delta(Delta(role="assistant", content=""))
            await events.relay(piece)
            while not piece.is_final:
                piece = await anext(answer)
                await events.relay(piece)
        except AnswerTimeoutError as exc:
            await events.send(wire.error_envelope(504, ErrorCode.DEADLINE_EXCEEDED, str(exc)))
        except nats.errors.Error as exc:
            await events.send(wire.error_envelope(503, wire.BUS_UNAVAILABLE, _bus_failed(exc)))
    except ConnectionResetError:
        log.debug("[%s] the client left mid-stream", req.request_id)
    except asyncio.CancelledError:  # the server saw the connection close (start_http)
        log.debug("[%s] the client left mid-stream", req.request_id)
        raise
    return resp
