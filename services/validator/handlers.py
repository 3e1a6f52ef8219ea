"""Validator subscriber: parser gate for CODE_GENERATION (RC-07) with one retry (RC-08)."""

from __future__ import annotations

import enum
import logging
import time
from typing import Protocol

import msgspec

from services.validator.settings import ValidatorSettings
from shared.bus import AnswerStream, Bus, publish_stage
from shared.codec import encode
from shared.consumer import Delivery, Stage
from shared.contracts import pipeline
from shared.contracts.pipeline import VALIDATE_SUBJECT, generate_subject
from shared.contracts.response import ValidationStatus
from shared.contracts.routing import ModelSlot
from shared.stage import PermanentError, decode_or_report, finish_turn, stage_guard, stage_spec
from shared.store.stores import Store

log = logging.getLogger("intentroute.validator")


class Outcome(enum.StrEnum):
    VALID = "valid"
    INVALID = "invalid"
    UNAVAILABLE = "unavailable"


class Verdict(msgspec.Struct, frozen=True):
    outcome: Outcome
    # Parser trace rendered as `<parser_feedback>` lines when INVALID.
    feedback: str = ""


class CodeChecker(Protocol):
    @property
    def enabled(self) -> bool: ...

    async def verdict(self, code: str) -> Verdict: ...


class Unvalidated:
    """No parser configured: every answer is delivered as PARSER_UNAVAILABLE."""

    enabled = False

    async def verdict(self, code: str) -> Verdict:
        log.warning("[ptvl] parser unavailable — returning unvalidated")
        return Verdict(Outcome.UNAVAILABLE)


class ValidatorDeps:
    def __init__(
        self, bus: Bus, store: Store, checker: CodeChecker, extract: ExtractCode
    ) -> None:
        self.bus = bus
        self.store = store
        self.checker = checker
        self.extract = extract

    async def close(self) -> None:
        close = getattr(self.checker, "close", None)
        if close is not None:
            await close()
        await self.store.close()


class ExtractCode(Protocol):
    def __call__(self, answer: str) -> str: ...


def build_stage(settings: ValidatorSettings) -> Stage[ValidatorDeps]:
    async def on_validate(msg: Delivery, deps: ValidatorDeps) -> None:
        bus = deps.bus
        env = await decode_or_report(bus, msg, "validate")
        if env is None:
            return
        async with stage_guard(bus, msg, env, stage="validate",
                               max_deliver=settings.common.max_deliver, store=deps.store):
            started = time.perf_counter()
            if env.decision is None:
                raise PermanentError("NO_DECISION", "envelope reached the validator unclassified")
            req = env.request
            out = AnswerStream(bus, req.request_id, start_seq=env.seq)
            if env.attempt == 0:
                await out.status("validating AVAP code")
            code = deps.extract(env.answer)
            if code or not deps.checker.enabled:
                verdict = await deps.checker.verdict(code)
            else:
                verdict = Verdict(
                    Outcome.INVALID,
                    "<parser_feedback>\nLine 1: the answer contains no AVAP program — reply "
                    "with the program in one ```avap block.\n</parser_feedback>",
                )
            key = f"validate.{env.attempt}"
            env.timings[key] = round((time.perf_counter() - started) * 1000, 3)
            if verdict.outcome == Outcome.INVALID and env.attempt == 0:
                # RC-08: one trace-guided retry, never more.
                await out.status("the parser rejected the code; regenerating with its trace")
                env.attempt = 1
                env.parser_feedback = verdict.feedback
                env.seq = out.seq
                await publish_stage(bus, generate_subject(ModelSlot.MAIN), encode(env),
                                    msg_id=f"{req.request_id}:parser-retry")
                return
            status = {
                Outcome.VALID: ValidationStatus.VALID,
                Outcome.INVALID: ValidationStatus.INVALID_UNRESOLVED,
                Outcome.UNAVAILABLE: ValidationStatus.PARSER_UNAVAILABLE,
            }[verdict.outcome]
            retried = env.attempt > 0
            await out.text(env.answer)
            await finish_turn(deps.store, env, answer=env.answer, answered_by=env.answered_by,
                              validation_status=status.value, retried=retried)
            await out.final(decision=env.decision, validation_status=status.value,
                            avap_code=code, answered_by=env.answered_by, retried=retried)

    return Stage(
        stage_spec(
            settings.common,
            stream=pipeline.STREAM,
            subject=VALIDATE_SUBJECT,
            durable="validator",
            max_inflight=settings.batch_size,
        ),
        on_validate,
    )
