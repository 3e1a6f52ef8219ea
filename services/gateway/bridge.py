"""What every door in front of the pipeline does for a caller that does not speak NATS
(gRPC, the OpenAI-compatible HTTP API): who is asking, is the request well formed, and
its answer's chunks.

The agent is its bearer token's (a wrong one counted against the client's address,
throttle.py); the request is checked as a NATS one is (validation.check_request) and
published on the agent's own `agent.request.<agent_id>` through the gateway's
connection (its answer followed through one subscription per agent, `AnswerRouter`),
so it takes the same durable path as a NATS caller's: the fair scheduler's
turns, the per-agent limits at admission (their refusals come back as final chunks with
`REFUSALS` codes and `retry_after_ms`), the workers, one final chunk.

Each answered request is a SERVER span of the door (`answer`), the child of the
caller's W3C `traceparent` when it sent one (gRPC metadata, HTTP headers); the span's
context goes on in the request's NATS headers, so the door, every stage and the store
writes are one trace. The span carries the request's ids, and from the final chunk its
query type, deciding layer and error code (shared.common.otel).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing

from nats.aio.client import Client
from opentelemetry import trace
from opentelemetry.trace import Span, StatusCode, Tracer

from services.gateway.limits.logic import REFUSALS
from services.gateway.throttle import AuthThrottle
from services.gateway.validation import InputError, check_request
from shared.auth.ports import AgentInfo, TokenVerifier
from shared.client.answers import AnswerRouter
from shared.client.caller import ask
from shared.common.otel import request_attributes
from shared.contracts.request import AgentRequest
from shared.contracts.response import ErrorInfo, ResponseChunk
from shared.runtime.telemetry import door_span, trace_headers

# Seconds a door waits past the caller's own `timeout_ms` before it ends the answer
# itself: the pipeline's deadline runs from admission, a few ms after the publish, so its
# typed DEADLINE_EXCEEDED final comes first while its workers run; with them down or
# hung the caller still hears within its timeout (not the door's ANSWER_TIMEOUT).
DEADLINE_GRACE = 2.0


class Door:
    def __init__(self, nc: Client, agents: TokenVerifier, throttle: AuthThrottle, *,
                 answer_timeout: float, tracer: Tracer | None = None) -> None:
        self.nc = nc
        self.router = AnswerRouter(nc)
        self.tracer = tracer or trace.NoOpTracer()
        self.agents = agents
        self.throttle = throttle
        self.answer_timeout = answer_timeout

    async def caller(self, token: str, address: str) -> AgentInfo | None:
        """The token's agent; None: no token or a wrong one; ThrottledError when
        `address` presented too many wrong ones lately."""
        return await self.throttle.verify(self.agents, token, address)

    @staticmethod
    def check(req: AgentRequest, agent_id: str) -> AgentRequest | InputError:
        return check_request(req, agent_id)

    async def answer(self, req: AgentRequest, *, span_name: str = "ask",
                     carrier: Mapping[str, str] | None = None,
                     attributes: Mapping[str, str] | None = None,
                     ) -> AsyncGenerator[ResponseChunk, None]:
        """The answer's chunks, to its final one. AnswerTimeoutError when none comes
        within the door's timeout (or the request's `timeout_ms` and DEADLINE_GRACE,
        when shorter); RequestRefusedError when the request stream is full.
        The door's span (`span_name`, its `attributes`) continues the `traceparent` of
        `carrier` (the call's headers or metadata) and ends with the answer."""
        span = door_span(self.tracer, span_name, carrier or {},
                         {**(attributes or {}),
                          **request_attributes(req.request_id, req.agent_id)})
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
                    yield chunk
        except Exception as exc:
            span.record_exception(exc)
            span.set_status(StatusCode.ERROR, type(exc).__name__)
            raise
        finally:
            span.end()


    def waits(self, req: AgentRequest) -> float:
        """Seconds the door follows `req`'s answer before it gives up."""
        if req.timeout_ms > 0:
            return min(self.answer_timeout, req.timeout_ms / 1000 + DEADLINE_GRACE)
        return self.answer_timeout


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
    return error is not None and error.code in REFUSALS


def refusal(chunk: ResponseChunk) -> ErrorInfo | None:
    """The error of a request refused at admission by a per-agent limit, else None."""
    return chunk.error if is_refusal(chunk.error) else None


def retry_after_seconds(retry_after_ms: int) -> int:
    """Whole seconds for a `Retry-After` header / trailer, rounded up (at least 1)."""
    return max(1, -(-retry_after_ms // 1000))
