"""The doors' HTTP face (aiohttp.web): `POST /agents/{agent_id}/feedback` (ADR-0006).

`build_http_app` returns the Application before it is started, so the other doors add
their routes to the same server; `start_http` serves it. Its routes:

| route | token | what |
|---|---|---|
| `POST /agents/{agent_id}/feedback` | agent | a verdict on an answer (below) |
| `POST /v1/chat/completions` | agent (API key) | ask OpenAI-style, streamed or not (openai_door/) |
| `GET /v1/models`, `GET /v1/models/{model}` | agent | `intentroute` and one model per route |
| `GET /healthz` | none | 200 while the process serves (health.py) |
| `GET /readyz` | none | 200 when NATS and Postgres answer and it serves, else 503 |
| `/dashboard/...` | the operator's | the dashboard, with GATEWAY_DASHBOARD_TOKEN (dashboard/) |

Every refusal's status is its code's in the one table (shared.contracts.errors
`door_status`); the OpenAI door answers errors as OpenAI does (`{"error": {"message",
"type", "code", "param"}}`, `code` the same as on the other doors), with `Retry-After`
(and `retry-after-ms`) when a refusal says when to ask again.

At every route, a request aiohttp's parser refuses or a body that cannot be read is 400,
and what aiohttp logs about either is one line within a budget, no traceback (ServerLog).

Feedback carries the agent's bearer token (`Authorization: Bearer <token>`, the
`token` of its credential file), checked like gRPC's, and is published for the gateway
to record (door.Door.feedback); its body is the gateway's FeedbackAck:

| answer | when |
|---|---|
| 200 | stored (`repeat: true` when it replaced an earlier verdict) |
| 400 | not JSON, not the contract, a value out of bounds, or a `part` the request lacks |
| 401 | no token, or not a valid one |
| 403 | a valid token of another agent than the path's |
| 404 | the request id is not one of the agent's (unknown, or another agent's) |
| 413 | a body over 64 KiB |
| 429 | too many wrong credentials from this address lately (Retry-After: seconds) |
| 503 | the store or the bus cannot be reached (send again) |
| 504 | no acknowledgement in time (send again: a repeat updates, never counts twice) |
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler

from services.doors.door import Door, retry_after_seconds
from services.doors.log_budget import LEFT_OUT, LogBudget
from shared.auth.identity import bearer_value
from shared.contracts.checks import decode_feedback, refused
from shared.contracts.codec import encode
from shared.contracts.errors import IntentrouteError, InvalidInputError, door_status
from shared.contracts.feedback import FeedbackAck
from shared.contracts.response import ErrorCode

log = logging.getLogger("intentroute.doors.http")

FEEDBACK_PATH = "/agents/{agent_id}/feedback"
# Feedback is a few hundred bytes; anything much larger is not feedback.
MAX_BODY = 64 * 1024

DOOR_KEY = web.AppKey("door", Door)

# What a caller's malformed request raises: aiohttp's parser refusing its request line,
# a header or its framing (BadHttpMessage, LineTooLong, InvalidHeader, ...), or its body
# as a handler reads it (RequestPayloadError: a broken chunk, gzip that does not decode).
_MALFORMED = (HttpProcessingError, web.RequestPayloadError)
_REASON_CHARS = 200
_STATUS_LINE = re.compile(r"\d+, message:")



def build_http_app(door: Door) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY, middlewares=[malformed_body_is_400])
    app[DOOR_KEY] = door
    app.router.add_post(FEEDBACK_PATH, post_feedback)
    return app


@web.middleware
async def malformed_body_is_400(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A body that cannot be read (a broken chunk, gzip that does not decode) is the
    caller's error, at every door: 400, not a 500 logged with a traceback."""
    try:
        return await handler(request)
    except _MALFORMED as exc:
        raise web.HTTPBadRequest(text=f"malformed request: {reason(exc)}") from None


class ServerLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server logger for the doors' HTTP face (AppRunner's `logger`), its
    lines bounded as every line a caller can cause is (log_budget.py).

    aiohttp logs an ERROR with a traceback (a dozen lines) for each request its parser
    refuses before any handler runs (a bare CR, a NUL or an obs-fold in a header, a
    header over 8 KiB, an HTTP/2 preface) and for a body that cannot be read (a
    RequestPayloadError): such a line becomes one WARNING, aiohttp's message and the
    parser's reason on one line, no traceback. Another line (a handler's unexpected
    exception: a bug) keeps its level and its traceback. Each kind is written within a
    LogBudget of its own, so a flood of malformed requests never hides a bug's line: one
    line per message (aiohttp's names the client's address) and ten in all a minute, the
    next one telling how many were left out. DEBUG lines (LOG_LEVEL=DEBUG) pass as they
    are."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        logger = logger or logging.getLogger("aiohttp.server")
        super().__init__(logger, {})
        self.malformed = LogBudget(logger)
        self.failures = LogBudget(logger)

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if not self.isEnabledFor(level):
            return
        if level < logging.INFO:
            self.logger.log(level, msg, *args, **kwargs)
            return
        exc = _exception(kwargs.get("exc_info"))
        try:
            head = str(msg) % args if args else str(msg)
        except (TypeError, ValueError):
            head = str(msg)
        if isinstance(exc, _MALFORMED):
            self.malformed.warning(head, "%s (malformed request): %s", head, reason(exc))
            return
        left_out = self.failures.allow(f"{head} {type(exc).__name__}")
        if left_out is None:
            return
        if left_out:
            msg, args = f"{msg}{LEFT_OUT}", (*args, left_out)
        self.logger.log(level, msg, *args, **kwargs)


def _exception(exc_info: object) -> BaseException | None:
    """The exception a logging call's `exc_info` names."""
    if isinstance(exc_info, BaseException):
        return exc_info
    if isinstance(exc_info, tuple) and len(exc_info) == 3:
        return exc_info[1] if isinstance(exc_info[1], BaseException) else None
    return sys.exc_info()[1] if exc_info else None


def reason(exc: BaseException) -> str:
    """Why a request was refused, on one printable line: the exception's type and the
    first line of its message (aiohttp's parser quotes the caller's bytes escaped, on a
    line of their own), at most 200 characters of it."""
    text = exc.message if isinstance(exc, HttpProcessingError) else str(exc)
    # RequestPayloadError holds its cause as text: "400, message:\n  <reason>".
    lines = [line.strip() for line in str(text).splitlines()
             if line.strip() and not _STATUS_LINE.fullmatch(line.strip())]
    first = lines[0] if lines else ""
    first = "".join(c if c.isprintable() else repr(c)[1:-1] for c in first)
    return f"{type(exc).__name__}: {first[:_REASON_CHARS].rstrip(':')}"


def _json(ack: FeedbackAck, status: int, headers: Mapping[str, str] | None = None
          ) -> web.Response:
    return web.Response(body=encode(ack), status=status, content_type="application/json",
                        headers=headers)


def refusal(request_id: str, code: str, message: str, retry_after_ms: int = 0
            ) -> web.Response:
    """A refused verdict as its ack, with its code's status (the one table) and, when
    it says when to ask again, `Retry-After` / `retry-after-ms`; 401 names the scheme."""
    headers: dict[str, str] = {}
    if retry_after_ms > 0:
        headers = {"Retry-After": str(retry_after_seconds(retry_after_ms)),
                   "retry-after-ms": str(retry_after_ms)}
    if code == ErrorCode.UNAUTHENTICATED:
        headers["WWW-Authenticate"] = 'Bearer realm="intentroute"'
    return _json(refused(request_id, code, message), door_status(code).http, headers)


def bearer(request: web.Request) -> str:
    return bearer_value(request.headers.get("Authorization", ""))


async def post_feedback(request: web.Request) -> web.Response:
    door = request.app[DOOR_KEY]
    request_id = ""
    try:
        agent = await door.caller(bearer(request), request.remote or "")
        path_agent = request.match_info["agent_id"]
        if agent.agent_id != path_agent:
            raise InvalidInputError(
                ErrorCode.AGENT_MISMATCH,
                f"the token is agent '{agent.agent_id}', not '{path_agent}'")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise InvalidInputError(ErrorCode.OVERSIZED_FIELD,
                                    f"body exceeds {MAX_BODY} bytes") from None
        decoded = decode_feedback(body)
        if isinstance(decoded, FeedbackAck):
            ack = decoded
        else:
            request_id = decoded.request_id
            ack = await door.feedback(agent.agent_id, decoded)
    except IntentrouteError as exc:
        return refusal(request_id, exc.code, exc.message, exc.retry_after_ms)
    if ack.accepted:
        return _json(ack, 200)
    return _json(ack, door_status(ack.error_code).http)


async def start_http(app: web.Application, listen: str) -> tuple[web.AppRunner, str]:
    """Serve `app` on `listen` (`host:port`; port 0 picks a free one). Replicas may share
    one port (SO_REUSEPORT: the kernel spreads connections among them). Returns the
    runner (its `cleanup` stops the server) and the bound URL."""
    host, port = split_listen(listen)
    # A client gone cancels its handler: its answer is no longer followed (the door's
    # hold on it, up to GATEWAY_ANSWER_TIMEOUT, was kept for nobody). The request itself
    # runs on (stored, replayable).
    # aiohttp's own lines (a request its parser refuses, a handler's exception) within a
    # budget, as every line a caller can cause (ServerLog); no access log.
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True,
                           logger=ServerLog())
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_port=True)
    await site.start()
    url = bound_url(runner, host)
    log.info("[doors] HTTP listening on %s", url)
    return runner, url


def split_listen(listen: str) -> tuple[str, int]:
    parts = urlsplit(f"//{listen.strip()}")
    if parts.port is None:
        raise ValueError(f"GATEWAY_HTTP_LISTEN={listen!r}: expected host:port")
    return parts.hostname or "0.0.0.0", parts.port or 0


def http_url(host: str, port: int) -> str:
    """The URL a local client uses for a listen address (a wildcard host -> loopback)."""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def bound_url(runner: web.AppRunner, host: str) -> str:
    for address in runner.addresses:
        if isinstance(address, tuple):
            return http_url(host, int(address[1]))
    return ""
