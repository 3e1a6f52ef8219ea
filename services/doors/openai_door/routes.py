"""`POST /v1/chat/completions` and `GET /v1/models` on the doors' HTTP server: the
OpenAI SDK (and whatever speaks its API) as a caller, the agent's token as its API key.

A chat request goes one way through (`chat_completions`): admit the caller (its token,
the throttle of wrong ones, its budget of bytes read), decode the body (wire.decode),
check the request as every door does, ask the pipeline (door.Door: published on the
agent's `agent.request.<agent_id>`, so the fair share and the per-agent limits apply),
render the answer (collected here, streamed by stream.py). The agent's policy, read per
request through the doors' policy cache, says which fleet models it may name as `model`
and `GET /v1/models` lists (model_names.py). Whatever refuses it on the way is an
IntentrouteError, rendered in one place (`_refused`) with its code's status and OpenAI
error type (the one table, shared.contracts.errors), `Retry-After` and `retry-after-ms`
when it says when to ask again. A stream's HTTP status is chosen on the answer's first
chunk: a request refused at admission, or answered with an error before any text, gets
its error status and body; an error after text went out is an `data: {"error": ...}`
event (the SDK raises APIError), with no `[DONE]` after it.

Every answer says what the door itself took, in W3C `Server-Timing` (which browsers'
developer tools and most HTTP tooling show): `door` = from the handler's start to the
request handed to the bus, plus (collected answers) from the final chunk to the response;
`pipeline` = the rest, the workers' time. `bench pipeline --door openai` reports both.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

import msgspec
from aiohttp import web

from services.doors.door import Door, retry_after_seconds
from services.doors.openai_door import model_names, wire
from services.doors.openai_door.stream import stream
from services.doors.throttle import BodyBudget
from shared.auth.identity import bearer_value
from shared.auth.ports import AgentInfo
from shared.client.caller import assemble
from shared.contracts.errors import IntentrouteError, InvalidInputError, RetryableError
from shared.contracts.request import AgentRequest
from shared.contracts.response import ErrorCode, ErrorInfo, ResponseChunk
from shared.policy.agent import AgentPolicy
from shared.policy.ports import Policies

log = logging.getLogger("intentroute.doors.openai")

CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
SESSION_HEADER = "X-Session-Id"
# A chat request carries the whole conversation at every turn: 2 MiB holds one of
# ~500k characters (a 128k-token context) twice over; the app's own limit is 64 KiB.
MAX_CHAT_BODY = 2 * 1024 * 1024

DOOR_KEY = web.AppKey("openai_door", Door)
BODY_BUDGET_KEY = web.AppKey("openai_body_budget", BodyBudget)
POLICIES_KEY = web.AppKey("openai_policies", Policies)
CREATED_KEY = web.AppKey("openai_created", int)

_encode = msgspec.json.Encoder().encode
NO_POLICY = AgentPolicy()
# Set on a request whose body was refused on its declared length, unread.
_REFUSED_UNREAD = "intentroute.refused_unread"


class NoPolicies:
    """Every agent with the global defaults: no fleet model to choose."""

    def policy_for(self, agent_id: str, request_id: str = "") -> AgentPolicy:
        return NO_POLICY


def add_openai_routes(app: web.Application, door: Door,
                      body_budget: BodyBudget | None = None,
                      policies: Policies | None = None) -> None:
    """The door's routes on `app`; `policies`: the agents' (the doors' policy cache),
    None: no agent may name a fleet model."""
    app[DOOR_KEY] = door
    app[BODY_BUDGET_KEY] = body_budget or BodyBudget()
    app[POLICIES_KEY] = policies or NoPolicies()
    app[CREATED_KEY] = int(time.time())
    app.router.add_post(CHAT_PATH, chat_completions)
    app.router.add_get(MODELS_PATH, list_models)
    app.router.add_get(MODELS_PATH + "/{model:.+}", get_model)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    door = request.app[DOOR_KEY]
    ids: dict[str, str] = {}
    try:
        agent = await _caller(request)
        raw = await _body(request, agent.agent_id)
        chat, asked = wire.decode(raw, session_header=request.headers.get(SESSION_HEADER, ""),
                                  request_id=uuid.uuid4().hex,
                                  policy=_policy(request, agent))
        req = door.check(asked, agent.agent_id)
        ids = wire.headers_of(None, req.request_id, req.session_id)
        # The door's span continues the caller's `traceparent` header (door.Door).
        answer = door.answer(req, span_name=f"POST {CHAT_PATH}", carrier=request.headers,
                             attributes={"http.request.method": "POST",
                                         "http.route": CHAT_PATH})
        clock = _Clock(started)
        async with aclosing(answer):
            first = await anext(answer)
            if first.is_final and first.error is not None:
                return _answer_error(first.error, ids)
            if chat.stream:
                return await stream(request, req, chat, first, answer,
                                    {**ids, **clock.header()})
            return await _collect(req, chat, first, answer, clock)
    except IntentrouteError as exc:
        return _refused(exc, ids, unread=request.get(_REFUSED_UNREAD, False))


async def list_models(request: web.Request) -> web.Response:
    """The names this agent may send as `model` (model_names.py)."""
    try:
        policy = _policy(request, await _caller(request))
    except IntentrouteError as exc:
        return _refused(exc)
    return web.Response(body=_encode(model_names.model_list(request.app[CREATED_KEY], policy)),
                        content_type="application/json")


async def get_model(request: web.Request) -> web.Response:
    try:
        policy = _policy(request, await _caller(request))
        card = model_names.find(request.match_info["model"], request.app[CREATED_KEY], policy)
    except IntentrouteError as exc:
        return _refused(exc)
    return web.Response(body=_encode(card), content_type="application/json")


# -- admit ------------------------------------------------------------------------------

async def _caller(request: web.Request) -> AgentInfo:
    """The API key's agent (UnauthenticatedError, ThrottledError)."""
    return await request.app[DOOR_KEY].caller(
        bearer_value(request.headers.get("Authorization", "")), request.remote or "")


def _policy(request: web.Request, agent: AgentInfo) -> AgentPolicy:
    """The agent's policy as the doors' cache holds it now (a lookup, no I/O)."""
    return request.app[POLICIES_KEY].policy_for(agent.agent_id)


async def _body(request: web.Request, agent_id: str) -> bytes:
    """The body, within the agent's budget of bytes parsed (BodyBudget): its declared
    length is charged before reading (a body refused unread is not read at all), an
    undeclared one once read. OVERSIZED_FIELD past MAX_CHAT_BODY, RATE_LIMITED past the
    budget."""
    budget = request.app[BODY_BUDGET_KEY]
    declared = request.content_length
    if declared is not None:
        try:
            _within(budget, agent_id, declared)
        except IntentrouteError:
            request[_REFUSED_UNREAD] = True
            raise
    try:
        raw = await request.clone(client_max_size=MAX_CHAT_BODY).read()
    except web.HTTPRequestEntityTooLarge:
        raise _too_large() from None
    if declared is None:
        _within(budget, agent_id, len(raw))
    return raw


def _within(budget: BodyBudget, agent_id: str, size: int) -> None:
    if size > MAX_CHAT_BODY:
        raise _too_large()
    wait = budget.spend(agent_id, size)
    if wait:
        raise RetryableError(f"more request bytes a second than this door parses for one "
                             f"agent; retry in {wait} s", code=ErrorCode.RATE_LIMITED,
                             retry_after_ms=wait * 1000)


def _too_large() -> InvalidInputError:
    return InvalidInputError(ErrorCode.OVERSIZED_FIELD, f"body exceeds {MAX_CHAT_BODY} bytes")


# -- render: refusals -------------------------------------------------------------------

def _error(code: str, message: str, headers: dict[str, str], *, param: str | None = None,
           retry_after_ms: int = 0) -> web.Response:
    """An error as OpenAI answers it; with when to ask again (the SDK waits
    `retry-after-ms` before it retries, else `Retry-After`)."""
    if retry_after_ms > 0:
        headers = {**headers, "Retry-After": str(retry_after_seconds(retry_after_ms)),
                   "retry-after-ms": str(retry_after_ms)}
    if code == ErrorCode.UNAUTHENTICATED:
        headers = {**headers, "WWW-Authenticate": 'Bearer realm="intentroute"'}
    status, envelope = wire.error_envelope(code, message, param)
    return web.Response(body=_encode(envelope), status=status,
                        content_type="application/json", headers=headers)


def _refused(exc: IntentrouteError, headers: dict[str, str] | None = None, *,
             unread: bool = False) -> web.Response:
    """What refused the request before (or instead of) an answer, or ended it before its
    final chunk. `unread`: the body was refused unread; the connection is closed, not
    drained (it costs nothing more to skip)."""
    param = exc.param if isinstance(exc, InvalidInputError) else None
    response = _error(exc.code, exc.message, headers or {}, param=param,
                      retry_after_ms=exc.retry_after_ms)
    if unread:
        response.force_close()
    return response


def _answer_error(error: ErrorInfo, headers: dict[str, str]) -> web.Response:
    """An answer's error (its final chunk's) as its HTTP error."""
    return _error(error.code, error.message, headers, retry_after_ms=error.retry_after_ms)


# -- render: answers --------------------------------------------------------------------

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
    while not chunks[-1].is_final:
        chunks.append(await anext(answer))
    answered = time.perf_counter()
    final = chunks[-1]
    headers = wire.headers_of(final, req.request_id, req.session_id)
    if final.error is not None:
        return _answer_error(final.error, headers)
    # `assemble` honours the reset markers: a restarted answer is the new one alone.
    body = _encode(wire.completion(final, assemble(chunks), req=req, asked=chat.model,
                                   created=int(time.time())))
    return web.Response(body=body, content_type="application/json",
                        headers={**headers, **clock.header(answered)})
