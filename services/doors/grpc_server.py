"""gRPC AskAgent / AskAgentStream / Feedback: the same contract for callers that speak gRPC.

Every call carries the agent's bearer token (`authorization: Bearer <token>` metadata),
checked against the `agents` table: none or a wrong one is UNAUTHENTICATED (too many
wrong ones from an address RESOURCE_EXHAUSTED, throttle.py), a body that names another
agent PERMISSION_DENIED, and only then a body that does not decode INVALID_ARGUMENT
(grpc_decode.py). A request is then checked like a NATS one (bad
input -> INVALID_ARGUMENT; its `timeout_ms` shortens the pipeline's deadline as on NATS)
and published on the agent's `agent.request.<agent_id>` (door.Door), so it takes the
same durable path through the workers. Feedback is published on the agent's
`agent.feedback.<agent_id>` and the gateway's ack awaited: bad input INVALID_ARGUMENT (a
`part` the request does not have among it), a request id that is not one of the
agent's (unknown or another agent's) NOT_FOUND, the store unreachable UNAVAILABLE.
Every refusal is an abort with the status of its code in the one table
(shared.contracts.errors.door_status), its details `CODE: message`, and `retry-after` /
`retry-after-ms` trailers when it says when to ask again. The same server answers
`grpc.health.v1.Health` and server reflection, without a token (grpc_health.py).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from typing import NoReturn

import grpc
import msgspec

from services.doors.door import Door, refusal, retry_after_seconds
from services.doors.grpc_decode import DeferDecodeErrors, Undecodable, reject_undecodable
from services.doors.grpc_health import OPEN_SERVICES, GrpcServer, HealthReporter, ReadyCheck
from services.doors.throttle import grpc_peer_address
from shared.auth.identity import bearer_value
from shared.auth.ports import AgentInfo
from shared.client.caller import assemble
from shared.contracts.errors import (
    IntentrouteError,
    InvalidInputError,
    door_status,
)
from shared.contracts.feedback import (
    Feedback,
    FeedbackMetadata,
    FeedbackOutcome,
)
from shared.contracts.request import AgentRequest
from shared.contracts.response import ErrorCode, ResponseChunk
from shared.contracts.routing import RoutingDecision
from shared.grpc import agent_pb2, agent_pb2_grpc

log = logging.getLogger("intentroute.doors.grpc")

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
        declared_ignored=decision.declared_ignored,
        history_unavailable=decision.history_unavailable)


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
    """InvalidInputError (INVALID_FIELD) for an outcome outside the vocabulary."""
    meta = msg.metadata
    try:
        outcome = FeedbackOutcome(msg.outcome)
    except ValueError:
        allowed = ", ".join(o.value for o in FeedbackOutcome)
        raise InvalidInputError(ErrorCode.INVALID_FIELD, f"outcome '{msg.outcome}' is not "
                                f"one of: {allowed}") from None
    return Feedback(
        request_id=msg.request_id,
        outcome=outcome,
        metadata=FeedbackMetadata(
            completion_quality=(meta.completion_quality
                                if meta.HasField("completion_quality") else None),
            latency_ms=meta.latency_ms if meta.HasField("latency_ms") else None,
            token_count=meta.token_count if meta.HasField("token_count") else None,
        ),
        part=msg.part if msg.HasField("part") else None,
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


async def abort(context: grpc.aio.ServicerContext, code: str, message: str,
                retry_after_ms: int = 0) -> NoReturn:
    """End the call with the gRPC status of `code` (the one table), details
    `CODE: message`, and `retry-after` (whole seconds, as HTTP's header) and
    `retry-after-ms` trailers when it says when to ask again."""
    if retry_after_ms > 0:
        context.set_trailing_metadata((
            ("retry-after", str(retry_after_seconds(retry_after_ms))),
            ("retry-after-ms", str(retry_after_ms))))
    await context.abort(grpc.StatusCode[door_status(code).grpc], f"{code}: {message}")
    raise AssertionError("unreachable")


async def abort_with(context: grpc.aio.ServicerContext, exc: IntentrouteError) -> NoReturn:
    await abort(context, exc.code, exc.message, exc.retry_after_ms)


class AssistanceEngine(agent_pb2_grpc.AssistanceEngineServicer):
    def __init__(self, door: Door) -> None:
        # The bridging to the pipeline, shared with the OpenAI-compatible door (pipeline.py).
        self._door = door

    async def _caller(self, claimed: str, context: grpc.aio.ServicerContext) -> AgentInfo:
        """The token's agent; ThrottledError / UnauthenticatedError when there is none,
        InvalidInputError (AGENT_MISMATCH) when the body names another."""
        agent = await self._door.caller(bearer_token(context),
                                        grpc_peer_address(context.peer()))
        if claimed and claimed != agent.agent_id:
            raise InvalidInputError(
                ErrorCode.AGENT_MISMATCH,
                f"the token is agent '{agent.agent_id}', not '{claimed}'")
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
        return self._door.check(to_request(request), agent.agent_id)

    async def _chunks(
        self, request: agent_pb2.AgentRequest | Undecodable,
        context: grpc.aio.ServicerContext, method: str
    ) -> AsyncIterator[ResponseChunk]:
        """The answer's chunks; every refusal (the door's, or the pipeline's admission)
        ends the call with its code's status."""
        try:
            req = await self._checked(request, context)
            async for chunk in self._door.answer(
                    req, span_name=f"{SERVICE}/{method}", carrier=metadata_carrier(context),
                    attributes={"rpc.system": "grpc", "rpc.service": SERVICE,
                                "rpc.method": method}):
                refused = refusal(chunk)
                if refused is not None:
                    await abort(context, refused.code, refused.message,
                                refused.retry_after_ms)
                yield chunk
        except IntentrouteError as exc:
            await abort_with(context, exc)

    async def AskAgentStream(
        self, request: agent_pb2.AgentRequest | Undecodable,
        context: grpc.aio.ServicerContext
    ) -> AsyncIterator[agent_pb2.AgentResponse]:
        async for chunk in self._chunks(request, context, "AskAgentStream"):
            yield to_response(chunk)

    async def AskAgent(
        self, request: agent_pb2.AgentRequest | Undecodable,
        context: grpc.aio.ServicerContext
    ) -> agent_pb2.AgentResponse:
        chunks: list[ResponseChunk] = []
        async for chunk in self._chunks(request, context, "AskAgent"):
            chunks.append(chunk)
            if chunk.is_final:
                final = to_response(chunk)
                final.text = assemble(chunks)
                return final
        await abort(context, ErrorCode.STAGE_FAILED, "answer ended without a final chunk")

    async def Feedback(
        self, request: agent_pb2.FeedbackRequest | Undecodable,
        context: grpc.aio.ServicerContext
    ) -> agent_pb2.FeedbackReply:
        try:
            claimed = "" if isinstance(request, Undecodable) else request.agent_id
            agent = await self._caller(claimed, context)
            if isinstance(request, Undecodable):
                await reject_undecodable(context, request)
            ack = await self._door.feedback(agent.agent_id, to_feedback(request))
        except IntentrouteError as exc:
            await abort_with(context, exc)
        if not ack.accepted:
            await abort(context, ack.error_code, ack.message)
        return agent_pb2.FeedbackReply(request_id=ack.request_id, accepted=True,
                                       repeat=ack.repeat)


async def start_grpc(
    door: Door,
    listen: str,
    *,
    tls: tuple[bytes, bytes] | None = None,
    ready: ReadyCheck | None = None,
) -> GrpcServer:
    """`tls`: (private key, certificate chain) in PEM; None serves plain text. `ready`:
    whether this replica can answer, for the health service (None: once started)."""
    server = grpc.aio.server(interceptors=(DeferDecodeErrors(OPEN_SERVICES),))
    # The generated registration function is untyped (grpc_tools emits no annotations).
    agent_pb2_grpc.add_AssistanceEngineServicer_to_server(  # type: ignore[no-untyped-call]
        AssistanceEngine(door), server)
    health = HealthReporter(ready)
    health.add_to(server)
    if tls is not None:
        server.add_secure_port(listen, grpc.ssl_server_credentials([tls]))
    else:
        server.add_insecure_port(listen)
    await server.start()
    await health.start()
    log.info("[doors] gRPC AskAgent / Feedback listening on %s%s (health, reflection)",
             listen, " (TLS)" if tls else "")
    return GrpcServer(server, health)
