"""NATS ingress: who is asking (the subject's agent), is the request well formed, hand on.

The agent is the last token of `agent.request.<agent_id>`, a subject only that agent's
credential may publish on. The body may name no agent or the same one; naming another
is refused (AGENT_MISMATCH). The gateway stamps the agent's trust on the envelope, which
only service users can publish, so the classifier never consults the payload for it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from services.gateway.limits.gate import LimitGate, answer_refusal
from services.gateway.limits.logic import Verdict, refusal
from services.gateway.ports import VerdictRecorder
from services.gateway.settings import GatewaySettings
from services.gateway.validation import InputError, parse_request, salvage_field
from shared.auth.ports import AgentDirectory
from shared.contracts import request as request_contract
from shared.contracts.codec import encode
from shared.contracts.pipeline import CLASSIFY_SUBJECT, Admitted
from shared.contracts.request import agent_of
from shared.contracts.response import (
    INVALID_REQUEST_ID,
    ChunkKind,
    ErrorCode,
    ErrorInfo,
    ResponseChunk,
    response_subject,
)
from shared.runtime.answer_stream import AnswerStream
from shared.runtime.answers import write_after_answer
from shared.runtime.ports import Delivery
from shared.runtime.stage import Call, Decode, Handoff, PermanentError, Stage, StageDeps, stage_spec
from shared.store.rows import RequestLogRow

log = logging.getLogger("intentroute.gateway")


@dataclass(kw_only=True)
class GatewayDeps(StageDeps):
    agents: AgentDirectory
    # Agents' verdicts on their answers, from every entry point (feedback.py).
    feedback: VerdictRecorder
    # Per-agent limits checked at admission (limits/); None: none checked.
    limits: LimitGate | None = None


class InvalidRequestError(ValueError):
    def __init__(self, error: InputError) -> None:
        super().__init__(error.message)
        self.error = error


def admitter(budget: float) -> Decode[Admitted]:
    """The gateway's decoder: the checked request of the subject's agent, or
    InvalidRequestError; its deadline is `budget` seconds from now, or sooner if the
    caller asked for less (`timeout_ms`)."""

    def admit(msg: Delivery) -> Admitted:
        parsed = parse_request(msg.data, agent_of(msg.subject))
        if isinstance(parsed, InputError):
            raise InvalidRequestError(parsed)
        now = time.time()
        asked = parsed.timeout_ms / 1000 if parsed.timeout_ms > 0 else budget
        return Admitted(request=parsed, accepted_at=now, deadline=now + min(budget, asked),
                        run=str(msg.stream_seq))

    return admit


async def reject_input(deps: GatewayDeps, msg: Delivery, exc: Exception) -> None:
    """Bad input ends as a final error chunk to its agent, never as a silent drop."""
    error = exc.error if isinstance(exc, InvalidRequestError) else InputError(
        ErrorCode.MALFORMED_JSON, f"request does not decode: {exc}")
    agent = agent_of(msg.subject)
    log.warning("[gateway] rejected request %r of %r: %s %s", error.request_id, agent,
                error.code, error.message)
    if error.request_id:
        await AnswerStream(deps.bus, agent, error.request_id,
                           run=str(msg.stream_seq)).error(error.code, error.message)
        await write_after_answer(deps.store, [RequestLogRow(
            request_id=error.request_id,
            agent_id=agent,
            session_id=salvage_field(msg.data, "session_id"),
            outcome=f"error:{error.code}",
        )], error.request_id)
        return
    # No request_id to address: answer on the agent's invalid subject with an excerpt.
    chunk = ResponseChunk(
        request_id="",
        seq=0,
        kind=ChunkKind.FINAL,
        is_final=True,
        text=msg.data[:512].decode("utf-8", errors="replace"),
        error=ErrorInfo(error.code, error.message),
    )
    await deps.bus.publish(response_subject(agent, INVALID_REQUEST_ID), encode(chunk))


async def on_request(env: Admitted, call: Call, deps: GatewayDeps) -> Handoff | None:
    agent = await deps.agents.get(env.request.agent_id)
    if agent is None or agent.revoked:
        # Publishing needs a live credential; this is a request queued before revocation.
        raise PermanentError(ErrorCode.UNKNOWN_AGENT,
                             f"agent '{env.request.agent_id}' is unknown or revoked")
    env.trusted = agent.trusted
    if deps.limits is not None:
        admission, limits = await deps.limits.check(env)
        refused = refusal(admission, limits)
        if refused is not None:
            await answer_refusal(deps.bus, deps.store, env, refused)
            return None
        env.degraded = admission.verdict == Verdict.DEGRADE
    return Handoff(CLASSIFY_SUBJECT, env, "accepted")


def build_stage(settings: GatewaySettings) -> Stage[Admitted, GatewayDeps]:
    return Stage(
        name="gateway",
        spec=stage_spec(
            settings.common,
            stream=request_contract.STREAM,
            subject=request_contract.SUBJECTS,
            durable="gateway",
            max_inflight=settings.batch_size,
        ).per_agent_stage(),
        decode=admitter(settings.common.request_deadline),
        logic=on_request,
        on_undecodable=reject_input,
        timed=False,
        admitted_only=False,
    )
