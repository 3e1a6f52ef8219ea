"""gRPC AskAgent / AskAgentStream / Feedback: the same contract for callers that speak gRPC.

Every call carries the agent's bearer token (`authorization: Bearer <token>` metadata),
checked against the `agents` table: none or a wrong one is UNAUTHENTICATED (too many
wrong ones from an address RESOURCE_EXHAUSTED, throttle.py), a body that names another
agent PERMISSION_DENIED, and only then a body that does not decode INVALID_ARGUMENT
(grpc_decode.py). A request is then checked like a NATS one (bad
input -> INVALID_ARGUMENT; its `timeout_ms` shortens the pipeline's deadline as on NATS)
and published on the agent's `agent.request.<agent_id>`, so
it takes the same durable path through the workers. Feedback goes to the same recorder
as the NATS and HTTP entry points (feedback_recorder.py): bad input INVALID_ARGUMENT, a request
id that is not one of the agent's (unknown or another agent's) NOT_FOUND, the store
unreachable UNAVAILABLE. The same server answers `grpc.health.v1.Health` and server
reflection, without a token (grpc_health.py).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator

import grpc
import msgspec
from nats.aio.client import Client
from opentelemetry.trace import Tracer

from services.gateway.bridge import Door, refusal, retry_after_seconds
from services.gateway.feedback_recorder import FeedbackRecorder
from services.gateway.grpc_decode import DeferDecodeErrors, Undecodable, reject_undecodable
from services.gateway.grpc_health import (
    OPEN_SERVICES,
    GrpcServer,
    HealthReporter,
    ReadyCheck,
)
from services.gateway.throttle import AuthThrottle, ThrottledError, grpc_peer_address
from services.gateway.validation import InputError
from shared.auth.identity import bearer_value
from shared.auth.ports import AgentInfo, TokenVerifier
from shared.client.answers import RequestInFlightError
from shared.client.caller import AnswerTimeoutError, RequestRefusedError, assemble
from shared.contracts.feedback import (
    Feedback,
    FeedbackAck,
    FeedbackMetadata,
    FeedbackOutcome,
)
from shared.contracts.request import AgentRequest
from shared.contracts.response import ErrorCode, ErrorInfo, ResponseChunk
from shared.contracts.routing import RoutingDecision
from shared.grpc import agent_pb2, agent_pb2_grpc
from shared.store.writer import StoreUnavailableError

log = logging.getLogger("intentroute.gateway.grpc")

# The service's full name, as callers and the door's spans name it.
SERVICE = agent_pb2.DESCRIPTOR.services_by_name["AssistanceEngine"].full_name


def to_request(msg: agent_pb2.AgentRequest) -> AgentRequest:
    return AgentRequest(
        request_id=msg.request_id or uuid.uuid4().hex,
        session_id=msg.session_id,
        agent_id=msg.agent_id,
        query=msg.query,
        query_type=msg.query_type or None,
        extra_context=msg.extra_context,
        user_info=msg.user_info,
        editor_context=msg.editor_context,
        timeout_ms=msg.timeout_ms,
    )


def to_decision(decision: RoutingDecision) -> agent_pb2.RoutingDecision:
    return agent_pb2.RoutingDecision(
        type=decision.type.value, layer=decision.layer.value, confidence=decision.confidence,
        model_slot=decision.model_slot.value, clarity=decision.clarity.value,
        alternatives=[agent_pb2.Alternative(type=a.type.value, confidence=a.confidence)
                      for a in decision.alternatives],
        resolved_reference=decision.resolved_reference,
        declared_ignored=decision.declared_ignored)


def to_response(chunk: ResponseChunk) -> agent_pb2.AgentResponse:
    return agent_pb2.AgentResponse(
        text=chunk.text,
        avap_code=chunk.avap_code,
        is_final=chunk.is_final,
        validation_status=chunk.validation_status,
        query_type=chunk.query_type,
        request_id=chunk.request_id,
        kind=chunk.kind.value,
        error_code=chunk.error.code if chunk.error else "",
        error_message=chunk.error.message if chunk.error else "",
        # Both forms of the decision: the JSON string for old clients, the message.
        decision_json=msgspec.json.encode(chunk.decision).decode() if chunk.decision else "",
        decision=to_decision(chunk.decision) if chunk.decision else None,
    )


def to_feedback(msg: agent_pb2.FeedbackRequest) -> Feedback:
    """ValueError for an outcome outside the vocabulary."""
    meta = msg.metadata
    return Feedback(
        request_id=msg.request_id,
        outcome=FeedbackOutcome(msg.outcome),
        metadata=FeedbackMetadata(
            completion_quality=(meta.completion_quality
                                if meta.HasField("completion_quality") else None),
            latency_ms=meta.latency_ms if meta.HasField("latency_ms") else None,
            token_count=meta.token_count if meta.HasField("token_count") else None,
        ),
    )


def metadata_carrier(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The call's text metadata by (lower-case) key: where a caller's `traceparent` is."""
    return {key.lower(): value for key, value in context.invocation_metadata() or ()
            if isinstance(value, str)}


def bearer_token(context: grpc.aio.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if (key.lower() == "authorization" and isinstance(value, str)
                and value.partition(" ")[0].lower() == "bearer"):
            return bearer_value(value)
    return ""


class AssistanceEngine(agent_pb2_grpc.AssistanceEngineServicer):
    def __init__(self, nc: Client, agents: TokenVerifier, *, answer_timeout: float,
                 feedback: FeedbackRecorder, throttle: AuthThrottle,
                 tracer: Tracer | None = None) -> None:
        # The bridging to the pipeline, shared with the OpenAI-compatible door (bridge.py).
        self._door = Door(nc, agents, throttle, answer_timeout=answer_timeout, tracer=tracer)
        self._feedback = feedback

    async def _caller(self, claimed: str, context: grpc.aio.ServicerContext) -> AgentInfo:
        """The token's agent; aborts when there is none or the body names another."""
        token = bearer_token(context)
        try:
            agent = await self._door.caller(token, grpc_peer_address(context.peer()))
        except ThrottledError as exc:
            context.set_trailing_metadata((("retry-after", str(exc.retry_after)),))
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            raise AssertionError("unreachable") from None
        if agent is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "a valid agent bearer token is required")
            raise AssertionError("unreachable")
        if claimed and claimed != agent.agent_id:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"AGENT_MISMATCH: the token is agent '{agent.agent_id}', not '{claimed}'")
        return agent

    async def _checked(
        self, request: agent_pb2.AgentRequest | Undecodable,
        context: grpc.aio.ServicerContext
    ) -> AgentRequest:
        # The token first: a body that does not decode is INVALID_ARGUMENT only for a
        # caller with a valid one (grpc_decode).
        claimed = "" if isinstance(request, Undecodable) else request.agent_id
        agent = await self._caller(claimed, context)
        if isinstance(request, Undecodable):
            await reject_undecodable(context, request)
        checked = self._door.check(to_request(request), agent.agent_id)
        if isinstance(checked, InputError):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"{checked.code}: {checked.message}"
            )
        assert isinstance(checked, AgentRequest)
        return checked

    async def _chunks(
        self, req: AgentRequest, context: grpc.aio.ServicerContext, method: str
    ) -> AsyncIterator[ResponseChunk]:
        try:
            async for chunk in self._door.answer(
                    req, span_name=f"{SERVICE}/{method}", carrier=metadata_carrier(context),
                    attributes={"rpc.system": "grpc", "rpc.service": SERVICE,
                                "rpc.method": method}):
                refused = refusal(chunk)
                if refused is not None:
                    await abort_refused(context, refused)
                if chunk.error is not None and chunk.error.code == ErrorCode.DUPLICATE_REQUEST:
                    # Its id was admitted already: its answer is on its own subject.
                    await context.abort(grpc.StatusCode.ALREADY_EXISTS,
                                        f"{chunk.error.code}: {chunk.error.message}")
                yield chunk
        except AnswerTimeoutError as exc:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        except RequestRefusedError as exc:  # the request stream is full (for this agent)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except RequestInFlightError as exc:  # its id is in flight: nothing was published
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(exc))

    async def AskAgentStream(
        self, request: agent_pb2.AgentRequest | Undecodable,
        context: grpc.aio.ServicerContext
    ) -> AsyncIterator[agent_pb2.AgentResponse]:
        req = await self._checked(request, context)
        async for chunk in self._chunks(req, context, "AskAgentStream"):
            yield to_response(chunk)

    async def AskAgent(
        self, request: agent_pb2.AgentRequest | Undecodable,
        context: grpc.aio.ServicerContext
    ) -> agent_pb2.AgentResponse:
        req = await self._checked(request, context)
        chunks: list[ResponseChunk] = []
        async for chunk in self._chunks(req, context, "AskAgent"):
            chunks.append(chunk)
            if chunk.is_final:
                final = to_response(chunk)
                final.text = assemble(chunks)
                return final
        await context.abort(grpc.StatusCode.INTERNAL, "answer ended without a final chunk")
        raise AssertionError("unreachable")

    async def Feedback(
        self, request: agent_pb2.FeedbackRequest | Undecodable,
        context: grpc.aio.ServicerContext
    ) -> agent_pb2.FeedbackReply:
        claimed = "" if isinstance(request, Undecodable) else request.agent_id
        agent = await self._caller(claimed, context)
        if isinstance(request, Undecodable):
            await reject_undecodable(context, request)
        try:
            fb = to_feedback(request)
        except ValueError:
            allowed = ", ".join(o.value for o in FeedbackOutcome)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"{ErrorCode.INVALID_FIELD}: outcome "
                                f"'{request.outcome}' is not one of: {allowed}")
            raise AssertionError("unreachable") from None
        try:
            ack = await self._feedback.record(agent.agent_id, fb)
        except StoreUnavailableError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"{ErrorCode.STORE_UNAVAILABLE}: {exc}")
            raise AssertionError("unreachable") from None
        if not ack.accepted:
            await context.abort(feedback_status(ack), f"{ack.error_code}: {ack.message}")
        return agent_pb2.FeedbackReply(request_id=ack.request_id, accepted=True,
                                       repeat=ack.repeat)


async def abort_refused(context: grpc.aio.ServicerContext, error: ErrorInfo) -> None:
    """A request refused at admission (a per-agent limit): RESOURCE_EXHAUSTED, with
    `retry-after` (whole seconds, as HTTP's header) and `retry-after-ms` trailers when
    the refusal says when to ask again."""
    if error.retry_after_ms > 0:
        context.set_trailing_metadata((
            ("retry-after", str(retry_after_seconds(error.retry_after_ms))),
            ("retry-after-ms", str(error.retry_after_ms))))
    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{error.code}: {error.message}")


def feedback_status(ack: FeedbackAck) -> grpc.StatusCode:
    if ack.error_code == ErrorCode.UNKNOWN_REQUEST:
        return grpc.StatusCode.NOT_FOUND
    return grpc.StatusCode.INVALID_ARGUMENT


async def start_grpc(
    nc: Client,
    listen: str,
    agents: TokenVerifier,
    *,
    answer_timeout: float,
    feedback: FeedbackRecorder,
    throttle: AuthThrottle,
    tls: tuple[bytes, bytes] | None = None,
    ready: ReadyCheck | None = None,
    tracer: Tracer | None = None,
) -> GrpcServer:
    """`tls`: (private key, certificate chain) in PEM; None serves plain text. `ready`:
    whether this replica can answer, for the health service (None: once started).
    `tracer`: the door's spans (bridge.Door)."""
    server = grpc.aio.server(interceptors=(DeferDecodeErrors(OPEN_SERVICES),))
    # The generated registration function is untyped (grpc_tools emits no annotations).
    agent_pb2_grpc.add_AssistanceEngineServicer_to_server(  # type: ignore[no-untyped-call]
        AssistanceEngine(nc, agents, answer_timeout=answer_timeout, feedback=feedback,
                         throttle=throttle, tracer=tracer), server
    )
    health = HealthReporter(ready)
    health.add_to(server)
    if tls is not None:
        server.add_secure_port(listen, grpc.ssl_server_credentials([tls]))
    else:
        server.add_insecure_port(listen)
    await server.start()
    await health.start()
    log.info("[gateway] gRPC AskAgent / Feedback listening on %s%s (health, reflection)",
             listen, " (TLS)" if tls else "")
    return GrpcServer(server, health)
