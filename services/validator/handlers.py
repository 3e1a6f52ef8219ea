"""Validator subscriber: parser gate for CODE_GENERATION (RC-07) with one retry (RC-08)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from opentelemetry.trace import SpanKind

from services.validator.extract import extract_avap_code
from services.validator.ports import CheckResult, CheckStatus, CodeChecker
from services.validator.settings import ValidatorSettings
from shared.cache.offer import CacheWriter
from shared.common.otel import request_attributes
from shared.contracts import pipeline
from shared.contracts.codec import decode_routed
from shared.contracts.pipeline import VALIDATE_SUBJECT, PartDone, Routed, generate_subject
from shared.contracts.response import ValidationStatus
from shared.contracts.routing import ModelSlot
from shared.runtime.answer_stream import AnswerStream
from shared.runtime.endings import answer_usage
from shared.runtime.message_parts import end_part
from shared.runtime.stage import Call, Handoff, Stage, StageDeps, finish_turn, payload, stage_spec

log = logging.getLogger("intentroute.validator")

# An answer with nothing to parse is invalid without asking the parser.
NO_PROGRAM_FEEDBACK = (
    "<parser_feedback>\nLine 1: the answer contains no AVAP program — reply with the program "
    "in one ```avap block.\n</parser_feedback>"
)

DELIVERED = {
    CheckStatus.VALID: ValidationStatus.VALID,
    CheckStatus.INVALID: ValidationStatus.INVALID_UNRESOLVED,
    CheckStatus.UNAVAILABLE: ValidationStatus.PARSER_UNAVAILABLE,
}


@dataclass(kw_only=True)
class ValidatorDeps(StageDeps):
    checker: CodeChecker
    # Stores the VALID answers the cache may keep (shared.cache.offer).
    answer_cache: CacheWriter | None = None


async def checked(code: str, env: Routed, deps: ValidatorDeps) -> CheckResult:
    """The parser's verdict, in a client span of the request (what the parser said, or
    why there was none)."""
    req, decision = env.request, env.decision
    with deps.tracer.start_as_current_span(
            "avap_parser.Validate", kind=SpanKind.CLIENT,
            attributes={"rpc.system": "grpc", "rpc.method": "Validate",
                        **request_attributes(req.request_id, req.agent_id,
                                             decision.type.value, decision.layer.value)},
    ) as span:
        verdict = await deps.checker.check(code)
        span.set_attribute("intentroute.parser.verdict", verdict.status.value)
        if verdict.reason:
            span.set_attribute("intentroute.parser.unavailable", verdict.reason)
        return verdict


def build_stage(settings: ValidatorSettings) -> Stage[Routed, ValidatorDeps]:
    async def on_validate(env: Routed, call: Call, deps: ValidatorDeps) -> Handoff | None:
        req = env.request
        out = await AnswerStream.resume(deps.bus, req.agent_id, req.request_id,
                                        start_seq=env.seq,
                                        redelivered=call.delivery.deliveries > 1)
        if env.attempt == 0:
            await out.status("validating AVAP code")
        code = extract_avap_code(env.answer)
        if code or not deps.checker.enabled:
            verdict = await checked(code, env, deps)
            feedback = verdict.feedback
        else:
            verdict, feedback = CheckResult(CheckStatus.INVALID), NO_PROGRAM_FEEDBACK
        timing = f"validate.{env.attempt}"
        if verdict.status == CheckStatus.INVALID and env.attempt == 0:
            # RC-08: one trace-guided retry, never more.
            await out.status("the parser rejected the code; regenerating with its trace")
            env.attempt = 1
            env.parser_feedback = feedback
            env.seq = out.seq
            return Handoff(generate_subject(ModelSlot.MAIN), env, "parser-retry", timing)
        call.mark(env, timing)
        status = DELIVERED[verdict.status].value
        retried = env.attempt > 0
        await out.text(env.answer)
        if env.parts:
            return await end_part(deps, out, env, PartDone(
                answer=env.answer, answered_by=env.answered_by, validation_status=status,
                avap_code=code, usage=env.usage))
        await finish_turn(deps.store, env, answer=env.answer, answered_by=env.answered_by,
                          validation_status=status, retried=retried)
        await out.final(decision=env.decision, validation_status=status, avap_code=code,
                        answered_by=env.answered_by, retried=retried,
                        usage=answer_usage(env))
        if deps.answer_cache is not None:
            deps.answer_cache.offer(env, answer=env.answer, answered_by=env.answered_by,
                                    validation_status=status, avap_code=code)
        return None

    return Stage(
        name="validate",
        spec=stage_spec(
            settings.common,
            stream=pipeline.STREAM,
            subject=VALIDATE_SUBJECT,
            durable="validator",
            max_inflight=settings.batch_size,
        ),
        decode=payload(decode_routed),
        logic=on_validate,
    )
