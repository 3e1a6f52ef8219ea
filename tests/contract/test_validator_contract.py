"""Contract tier, validator: generated code in, a validated answer or one retry out."""

from __future__ import annotations

from opentelemetry.trace import NoOpTracer

from services.validator.handlers import ValidatorDeps, build_stage
from services.validator.ports import CheckResult, CheckStatus
from services.validator.settings import ValidatorSettings
from shared.client.caller import assemble
from shared.contracts.codec import decode_routed
from shared.contracts.parser import TraceCode, TraceLine
from shared.contracts.pipeline import Routed
from shared.contracts.routing import QueryType
from shared.store.rows import RequestLogRow
from testkit.fakes import FakeStore, RecordingBus, ScriptedChecker
from testkit.wire import ADMISSION, COMMON, request, routed_decision, run_on_wire

ANSWER = "Here it is:\n```avap\naddVar(x, 1)\ngetSHA256(x)\n```"
TRACE = (TraceLine(2, 1, TraceCode.UNKNOWN_COMMAND, "unknown command 'getSHA256'",
                   "encodeSHA256"),)


def generated(rid: str, attempt: int = 0, seq: int = 0) -> Routed:
    return Routed(request=request(rid, "hash the password"), accepted_at=0.0,
                  decision=routed_decision(QueryType.CODE_GENERATION), answer=ANSWER,
                  answered_by="fake:m", attempt=attempt, seq=seq)


async def run(env: Routed, checker: ScriptedChecker) -> tuple[RecordingBus, FakeStore]:
    bus, store = RecordingBus(), FakeStore()
    deps = ValidatorDeps(bus=bus, store=store, tracer=NoOpTracer(),
        admission=ADMISSION, checker=checker)
    await run_on_wire(build_stage(ValidatorSettings(common=COMMON)), env, deps)
    return bus, store


async def test_invalid_code_goes_back_once_with_the_parser_trace() -> None:
    checker = ScriptedChecker(CheckResult(CheckStatus.INVALID, TRACE))
    bus, store = await run(generated("i-1"), checker)

    assert checker.checked == ["addVar(x, 1)\ngetSHA256(x)"]
    statuses = [c.text for c in bus.chunks("i-1")]
    assert statuses == ["validating AVAP code",
                        "the parser rejected the code; regenerating with its trace"]
    (retry,) = [s for s in bus.sent if s[0] == "intentroute.stage.generate.main"]
    assert (retry[1], retry[2]) == ("INTENTROUTE_PIPELINE", "a:i-1::parser-retry")
    out = decode_routed(retry[3])
    assert out.attempt == 1
    assert out.seq == 2
    assert "<parser_feedback>" in out.parser_feedback
    assert "encodeSHA256" in out.parser_feedback
    assert "validate.0" in out.timings
    assert store.rows == []


async def test_still_invalid_after_the_retry_is_delivered_unresolved() -> None:
    bus, store = await run(generated("i-2", attempt=1, seq=2),
                           ScriptedChecker(CheckResult(CheckStatus.INVALID, TRACE)))
    chunks = bus.chunks("i-2")
    assert chunks[0].seq == 2
    assert chunks[-1].is_final
    assert chunks[-1].validation_status == "INVALID_UNRESOLVED"
    assert chunks[-1].retried
    assert assemble(chunks) == ANSWER
    assert not [s for s in bus.sent if s[0].startswith("intentroute.")]
    log_row = store.rows[-1]
    assert isinstance(log_row, RequestLogRow)
    assert log_row.validation_status == "INVALID_UNRESOLVED"
    assert "validate.1" in log_row.stage_ms


async def test_valid_code_is_delivered_with_the_program() -> None:
    bus, store = await run(generated("v-1"), ScriptedChecker(CheckResult(CheckStatus.VALID)))
    final = bus.chunks("v-1")[-1]
    assert final.is_final
    assert final.validation_status == ""
    assert not final.retried
    assert final.avap_code == "addVar(x, 1)\ngetSHA256(x)"
    assert store.kinds() == ["HistoryRow", "TurnRow", "RequestLogRow"]


async def test_no_parser_delivers_unvalidated() -> None:
    checker = ScriptedChecker(CheckResult(CheckStatus.UNAVAILABLE, reason="disabled"),
                          enabled=False)
    bus, _ = await run(generated("u-1"), checker)
    assert bus.chunks("u-1")[-1].validation_status == "PARSER_UNAVAILABLE"


async def test_an_answer_without_code_is_retried_without_asking_the_parser() -> None:
    env = generated("n-1")
    env.answer = "I cannot write that."
    checker = ScriptedChecker()
    bus, _ = await run(env, checker)
    assert checker.checked == []
    (retry,) = [s for s in bus.sent if s[0] == "intentroute.stage.generate.main"]
    assert "contains no AVAP program" in decode_routed(retry[3]).parser_feedback
