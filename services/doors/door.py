"""The doors' one way into the pipeline, for callers that do not speak NATS (gRPC, HTTP
feedback, the OpenAI-compatible API): who is asking, is what they send well formed, and
the answer's chunks (or the verdict's ack).

The agent is its bearer token's (a wrong one counted against the client's address,
throttle.py); a request is checked as a NATS one is (shared.contracts.checks) and
published on the agent's own `agent.request.<agent_id>` through the doors' connection,
its answer followed through one subscription per agent (`AnswerRouter`), so it takes
the same durable path as a NATS caller's: the gateway's fair share and per-agent limits
at admission (their refusals come back as final chunks with ADMISSION_REFUSALS codes and
`retry_after_ms`), the workers, one final chunk. A verdict is checked and published on
the agent's `agent.feedback.<agent_id>`; the gateway's ack comes back on the agent's
`_feedback` subject (shared.client.caller.send_feedback).

What fails on the way is an `IntentrouteError` (shared.contracts.errors): a wrong token
an UnauthenticatedError, a throttled address a ThrottledError, bad input an
InvalidInputError, no final in time an AnswerTimeoutError, a full stream a
RequestRefusedError, NATS failing a BusUnavailableError. Each door renders it through
the one table of codes (`door_status`).

Each answered request is a SERVER span of the door (`answer`), the child of the
caller's W3C `traceparent` when it sent one (gRPC metadata, HTTP headers); the span's
context goes on in the request's NATS headers, so the door, every stage and the store
writes are one trace. The span carries the request's ids, and from the final chunk its
query type, deciding layer and error code (shared.common.otel). Each call is counted on
the services API (`intentroute status`, row `doors`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing

import nats.errors
from nats.aio.client import Client
from opentelemetry import trace
from opentelemetry.trace import Span, StatusCode, Tracer

from services.doors.throttle import AuthThrottle
from shared.auth.ports import AgentInfo, TokenVerifier
from shared.client.answers import AnswerRouter
from shared.client.caller import ask, send_feedback
from shared.common.otel import request_attributes
from shared.contracts.checks import check_feedback, check_request
from shared.contracts.errors import (
    ADMISSION_REFUSALS,
    IntentrouteError,
    InvalidInputError,
    RetryableError,
    UnauthenticatedError,
)
from shared.contracts.feedback import Feedback, FeedbackAck
from shared.contracts.request import AgentRequest
from shared.contracts.response import ErrorCode, ErrorInfo, ResponseChunk
from shared.runtime.signals import Outcome, StageStats
from shared.runtime.telemetry import door_span, trace_headers

# Seconds a door waits past the caller's own `timeout_ms` before it ends the answer
# itself: the pipeline's deadline runs from admission, a few ms after the publish, so its
# typed DEADLINE_EXCEEDED final comes first while its workers run; with them down or
# hung the caller still hears within its timeout (not the door's ANSWER_TIMEOUT).
DEADLINE_GRACE = 2.0
# Seconds a door waits for the gateway's ack of a verdict it published (the gateway
# retries an unreachable store meanwhile): past it DEADLINE_EXCEEDED (send it again: a
# repeat updates, never counts twice).
FEEDBACK_WAIT = 10.0
# Seconds a caller told BUS_UNAVAILABLE or QUEUE_FULL waits before asking again.
BUS_RETRY_MS = 1000


class BusUnavailableError(RetryableError):
    """NATS failed the publish or the answer's follow (a JetStream ack lost to a paused
    or restarting server: nats.errors.TimeoutError after 5 s)."""

    code = ErrorCode.BUS_UNAVAILABLE


def bus_failed(exc: nats.errors.Error) -> BusUnavailableError:
    return BusUnavailableError(f"the message bus failed the request ({type(exc).__name__}: "
                               f"{exc}); ask again", retry_after_ms=BUS_RETRY_MS)


class Door:
    def __init__(self, nc: Client, agents: TokenVerifier, throttle: AuthThrottle, *,
                 answer_timeout: float, tracer: Tracer | None = None,
                 stats: StageStats | None = None) -> None:
        self.nc = nc
        self.router = AnswerRouter(nc)
        self.tracer = tracer or trace.NoOpTracer()
        self.agents = agents
        self.throttle = throttle
        self.answer_timeout = answer_timeout
        self.stats = stats or StageStats("doors")

    async def caller(self, token: str, address: str) -> AgentInfo:
        """The token's agent; UnauthenticatedError: no token or a wrong one;
        ThrottledError when `address` presented too many wrong ones lately."""
        agent = await self.throttle.verify(self.agents, token, address)
        if agent is None:
            raise UnauthenticatedError("a valid agent bearer token is required "
                                       "(Authorization: Bearer <token>; the API key)")
        return agent

    @staticmethod
    def check(req: AgentRequest, agent_id: str) -> AgentRequest:
        """`req` as `agent_id` sends it, checked as the gateway checks it
        (InvalidInputError)."""
        checked = check_request(req, agent_id)
        if isinstance(checked, InvalidInputError):
            raise checked
        return checked

    async def answer(self, req: AgentRequest, *, span_name: str = "ask",
                     carrier: Mapping[str, str] | None = None,
                     attributes: Mapping[str, str] | None = None,
                     ) -> AsyncGenerator[ResponseChunk, None]:
        """The answer's chunks, to its final one. AnswerTimeoutError when none comes
        within the door's timeout (or the request's `timeout_ms` and DEADLINE_GRACE,
        when shorter); RequestRefusedError when the request stream is full;
        BusUnavailableError when NATS fails; RequestInFlightError when the agent's
        request of that id is followed here already.
        The door's span (`span_name`, its `attributes`) continues the `traceparent` of
        `carrier` (the call's headers or metadata) and ends with the answer."""
        span = door_span(self.tracer, span_name, carrier or {},
                         {**(attributes or {}),
                          **request_attributes(req.request_id, req.agent_id)})
        started, outcome = time.perf_counter(), Outcome.FAILED
        self.stats.inflight += 1
        # `ask` closed here, not left to the loop's finalizer of abandoned generators:
        # a caller gone mid-answer (this generator closed) leaves its AnswerRouter
        # queue at once (it stayed one loop turn and more without, measured).
        chunks = ask(self.nc, req, timeout=self.waits(req),
                     headers=trace_headers(span), router=self.router)
        try:
            async with aclosing(chunks):
                async for chunk in chunks:
                    if chunk.is_final:
                        _settled(span, chunk)
                        outcome = Outcome.ERROR if chunk.error is not None else Outcome.OK
                    yield chunk
        except nats.errors.Error as exc:
            span.record_exception(exc)
            span.set_status(StatusCode.ERROR, type(exc).__name__)
            raise bus_failed(exc) from exc
        except Exception as exc:
            span.record_exception(exc)
            span.set_status(StatusCode.ERROR, type(exc).__name__)
            outcome = Outcome.ERROR if isinstance(exc, IntentrouteError) else outcome
            raise
        finally:
            span.end()
            self.stats.inflight -= 1
            self.stats.record(outcome, time.perf_counter() - started)

    def waits(self, req: AgentRequest) -> float:
        """Seconds the door follows `req`'s answer before it gives up."""
        if req.timeout_ms > 0:
            return min(self.answer_timeout, req.timeout_ms / 1000 + DEADLINE_GRACE)
        return self.answer_timeout

    async def feedback(self, agent_id: str, fb: Feedback) -> FeedbackAck:
        """`agent_id`'s verdict, checked, published for the gateway to record, and the
        gateway's ack (a refusing one for a verdict out of bounds, unpublished).
        AnswerTimeoutError when no ack comes within FEEDBACK_WAIT; BusUnavailableError
        when NATS fails."""
        bad = check_feedback(fb)
        if bad is not None:
            return bad
        started, outcome = time.perf_counter(), Outcome.FAILED
        try:
            ack = await send_feedback(self.nc, agent_id, fb, timeout=FEEDBACK_WAIT)
            outcome = Outcome.OK if ack.accepted else Outcome.ERROR
            return ack
        except nats.errors.Error as exc:
            outcome = Outcome.ERROR
            raise bus_failed(exc) from exc
        except IntentrouteError:
            outcome = Outcome.ERROR
            raise
        finally:
            self.stats.record(outcome, time.perf_counter() - started)


def _settled(span: Span, final: ResponseChunk) -> None:
    """The door's span learns how the request was routed and how it ended."""
    if not span.is_recording():
        return
    decision = final.decision
    span.set_attributes(request_attributes(
        query_type=final.query_type or (decision.type.value if decision else ""),
        layer=decision.layer.value if decision else ""))
    if final.error is not None:
        span.set_attribute("intentroute.error_code", final.error.code)
        if not is_refusal(final.error):  # a limit's refusal is the caller's to heed
            span.set_status(StatusCode.ERROR, final.error.code)


def is_refusal(error: ErrorInfo | None) -> bool:
    """Was the request refused at admission by a per-agent limit?"""
    return error is not None and error.code in ADMISSION_REFUSALS


def refusal(chunk: ResponseChunk) -> ErrorInfo | None:
    """The error of a request refused at admission by a per-agent limit, else None."""
    return chunk.error if is_refusal(chunk.error) else None


def retry_after_seconds(retry_after_ms: int) -> int:
    """Whole seconds for a `Retry-After` header / trailer, rounded up (at least 1)."""
    return max(1, -(-retry_after_ms // 1000))
