"""NATS ingress: who is asking (the subject's agent), is the request well formed, hand on.

The agent is the last token of `agent.request.<agent_id>`, a subject only that agent's
credential may publish on. The body may name no agent or the same one; naming another
is refused (AGENT_MISMATCH). A request naming a model (`model`) its agent's policy does
not let it choose (`models=`) is refused UNKNOWN_MODEL before any work, whichever door
it came through (the generator refuses one the fleet does not serve). The gateway stamps
the agent's trust on the envelope, which only service users can publish, so the
classifier never consults the payload for it.

A request id is admitted once: the first message naming it (a request, or malformed
input carrying the id) claims it (`admission_subject`, kept as long as answers are);
every later one — the same request sent again, forged or malformed — is answered
DUPLICATE_REQUEST on the agent's `_invalid` subject and logged as a row of its own, so
the id's answer subject keeps its one final chunk and its row what was answered and
billed. A redelivery of the admitted message is the same run and goes on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from services.gateway.limits.gate import LimitGate, answer_refusal
from services.gateway.limits.logic import refusal
from services.gateway.limits.ports import Verdict
from services.gateway.ports import VerdictRecorder
from services.gateway.settings import GatewaySettings
from shared.auth.ports import AgentDirectory
from shared.contracts import request as request_contract
from shared.contracts.checks import parse_request, salvage_field
from shared.contracts.codec import encode
from shared.contracts.errors import InvalidInputError, PermanentError
from shared.contracts.pipeline import CLASSIFY_SUBJECT, Admitted
from shared.contracts.request import agent_of
from shared.contracts.response import (
    CLAIM_STREAM,
    INVALID_REQUEST_ID,
    ChunkKind,
    ErrorCode,
    ErrorInfo,
    ResponseChunk,
    admission_subject,
    response_subject,
)
from shared.policy.agent import AgentPolicy
from shared.policy.chain import check_asked
from shared.policy.ports import Policies
from shared.runtime.answer_stream import AnswerStream
from shared.runtime.endings import write_after_answer
from shared.runtime.ports import Delivery
from shared.runtime.stage import Call, Decode, Handoff, Stage, StageDeps, stage_spec
from shared.store.rows import RequestLogRow

log = logging.getLogger("intentroute.gateway")

NO_POLICY = AgentPolicy()


@dataclass(kw_only=True)
class GatewayDeps(StageDeps):
    agents: AgentDirectory
    # Agents' verdicts on their answers, from every entry point (feedback_recorder.py).
    feedback: VerdictRecorder
    # Per-agent limits checked at admission (limits/); None: none checked.
    limits: LimitGate | None = None
    # Agents' policies (the models each may name); None: no agent may name one.
    policies: Policies | None = None


def admitter(budget: float) -> Decode[Admitted]:
    """The gateway's decoder: the checked request of the subject's agent (else it raises
    the InvalidInputError); its deadline is `budget` seconds from now, or sooner if the
    caller asked for less (`timeout_ms`)."""

    def admit(msg: Delivery) -> Admitted:
        parsed = parse_request(msg.data, agent_of(msg.subject))
        if isinstance(parsed, InvalidInputError):
            raise parsed
        now = time.time()
        asked = parsed.timeout_ms / 1000 if parsed.timeout_ms > 0 else budget
        return Admitted(request=parsed, accepted_at=now, deadline=now + min(budget, asked),
                        run=str(msg.stream_seq))

    return admit


async def admit_once(deps: StageDeps, agent: str, request_id: str, run: str) -> bool:
    """Claim `request_id` for this run of it: True if the run may answer on the id's
    subject (the first to claim it, or a redelivery of that message), False if another
    message claimed it first. A claim no worker sealed cannot be stored by an agent
    (agents have no grant in the stack's account): it is logged and let through."""
    claimed = await deps.bus.publish_first(
        admission_subject(agent, request_id), run.encode(), stream=CLAIM_STREAM,
        msg_id=f"{agent}:{request_id}:admitted:{run}")
    if claimed is None:
        log.error("[%s] the admission claim of %r holds no worker's seal; admitted",
                  request_id, agent)
        return True
    return claimed == run.encode()


async def refuse_duplicate(deps: StageDeps, agent: str, request_id: str, session_id: str,
                           code: str = ErrorCode.DUPLICATE_REQUEST,
                           message: str = "") -> None:
    """A message naming an admitted request id: answered on the agent's `_invalid`
    subject (the chunk names the id) and logged as a row of its own (no envelope, so
    the writer gives it its own time: it never meets the id's row)."""
    message = message or (f"request id {request_id!r} was admitted already: this message "
                          "is not run; its answer is on the id's subject (`replay` reads it)")
    log.warning("[gateway] %s of %r for request %r", code, agent, request_id)
    chunk = ResponseChunk(request_id=request_id, seq=0, kind=ChunkKind.FINAL, is_final=True,
                          error=ErrorInfo(code, message))
    await deps.bus.publish(response_subject(agent, INVALID_REQUEST_ID), encode(chunk))
    await write_after_answer(deps.store, [RequestLogRow(
        request_id=request_id, agent_id=agent, session_id=session_id,
        outcome=f"error:{code}",
    )], request_id)


async def reject_input(deps: GatewayDeps, msg: Delivery, exc: Exception) -> None:
    """Bad input ends as a final error chunk to its agent, never as a silent drop: on
    its request id's subject when the id is new (the id is then used), else on the
    agent's `_invalid` subject."""
    error = exc if isinstance(exc, InvalidInputError) else InvalidInputError(
        ErrorCode.MALFORMED_JSON, f"request does not decode: {exc}")
    agent = agent_of(msg.subject)
    log.warning("[gateway] rejected request %r of %r: %s %s", error.request_id, agent,
                error.code, error.message)
    if error.request_id:
        run = str(msg.stream_seq)
        if not await admit_once(deps, agent, error.request_id, run):
            await refuse_duplicate(deps, agent, error.request_id,
                                   salvage_field(msg.data, "session_id"), error.code,
                                   error.message)
            return
        await AnswerStream(deps.bus, agent, error.request_id,
                           run=run).error(error.code, error.message)
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
    req = env.request
    if not await admit_once(deps, req.agent_id, req.request_id, env.run):
        await refuse_duplicate(deps, req.agent_id, req.request_id, req.session_id)
        return None
    agent = await deps.agents.get(env.request.agent_id)
    if agent is None or agent.revoked:
        # Publishing needs a live credential; this is a request queued before revocation.
        raise PermanentError(f"agent '{env.request.agent_id}' is unknown or revoked",
                             code=ErrorCode.UNKNOWN_AGENT)
    env.trusted = agent.trusted
    if req.model:
        check_asked(req.model, deps.policies.policy_for(req.agent_id, req.request_id)
                    if deps.policies is not None else NO_POLICY)
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
