"""Circuit breaker transitions (fake clock) and the GuardedParser built on it (fake clients)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from services.validator.app import build_checker
from services.validator.breaker import BreakerState, CircuitBreaker
from services.validator.parser_client import (
    GuardedParser,
    ParserRejectedError,
    ParserUnavailableError,
)
from services.validator.ports import CheckStatus, ParseOutcome
from services.validator.settings import ValidatorSettings
from shared.contracts.parser import TraceLine
from testkit.clocks import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1000.0)


def open_breaker(clock: ManualClock, threshold: int = 3, cooldown: float = 30.0) -> CircuitBreaker:
    breaker = CircuitBreaker(threshold, cooldown, clock=clock)
    for _ in range(threshold):
        assert breaker.allow()
        breaker.record_failure()
    assert breaker.state is BreakerState.OPEN
    return breaker


# --------------------------------------------------------------------------- breaker


def test_defaults_match_the_adr() -> None:
    breaker = CircuitBreaker()
    assert (breaker.threshold, breaker.cooldown) == (3, 30.0)
    assert breaker.state is BreakerState.CLOSED


def test_opens_after_threshold_consecutive_failures(clock: ManualClock) -> None:
    breaker = CircuitBreaker(3, 30, clock=clock)
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.allow()
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN
    assert not breaker.allow()


def test_a_success_resets_the_consecutive_count(clock: ManualClock) -> None:
    breaker = CircuitBreaker(3, 30, clock=clock)
    breaker.record_failure()
    breaker.record_failure()
    breaker.record_success()
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state is BreakerState.CLOSED
    breaker.record_failure()  # the third in a row since the success
    assert breaker.state is BreakerState.OPEN


def test_open_until_cooldown_then_half_open(clock: ManualClock) -> None:
    breaker = open_breaker(clock)
    clock.advance(29.9)
    assert breaker.state is BreakerState.OPEN
    assert not breaker.allow()
    clock.advance(0.1)
    assert breaker.state is BreakerState.HALF_OPEN


def test_half_open_allows_exactly_one_probe(clock: ManualClock) -> None:
    breaker = open_breaker(clock)
    clock.advance(30)
    assert breaker.allow()
    assert not breaker.allow()
    assert not breaker.allow()
    assert breaker.state is BreakerState.HALF_OPEN


def test_probe_success_closes(clock: ManualClock) -> None:
    breaker = open_breaker(clock)
    clock.advance(30)
    assert breaker.allow()
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.allow()
    assert breaker.allow()
    # The count starts afresh: threshold failures are needed to open again.
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state is BreakerState.CLOSED


def test_probe_failure_reopens_with_a_new_cooldown(clock: ManualClock) -> None:
    breaker = open_breaker(clock)
    clock.advance(45)
    assert breaker.allow()
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN
    clock.advance(29)
    assert breaker.state is BreakerState.OPEN
    clock.advance(1)
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.allow()


def test_released_probe_lets_another_caller_probe(clock: ManualClock) -> None:
    breaker = open_breaker(clock)
    clock.advance(30)
    assert breaker.allow()
    breaker.release()
    assert breaker.allow()


def test_stragglers_do_not_move_an_open_circuit(clock: ManualClock) -> None:
    breaker = open_breaker(clock)
    clock.advance(20)
    breaker.record_failure()  # a call started before the circuit opened
    breaker.record_success()
    assert breaker.state is BreakerState.OPEN
    clock.advance(10)  # the cooldown still counts from the original opening
    assert breaker.state is BreakerState.HALF_OPEN


def test_state_changes_are_logged(clock: ManualClock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="intentroute.validator")
    breaker = open_breaker(clock)
    clock.advance(30)
    assert breaker.allow()
    breaker.record_success()
    messages = [r.getMessage() for r in caplog.records if r.name == "intentroute.validator"]
    assert messages == [
        "[ptvl] circuit OPEN — skipping parser",
        "[ptvl] circuit HALF-OPEN — probing parser availability",
        "[ptvl] circuit CLOSED — parser reachable",
    ]


def test_breaker_settings_come_from_the_environment() -> None:
    settings = ValidatorSettings.from_env({"PARSER_CB_THRESHOLD": "5",
                                           "PARSER_CB_COOLDOWN": "12.5"})
    breaker = build_checker(settings).breaker
    assert (breaker.threshold, breaker.cooldown) == (5, 12.5)


def test_rejects_nonsense_settings() -> None:
    with pytest.raises(ValueError, match="threshold must be >= 1"):
        CircuitBreaker(threshold=0)
    with pytest.raises(ValueError, match="cooldown must be >= 0"):
        CircuitBreaker(cooldown=-1)


# --------------------------------------------------------------------------- GuardedParser

TRACE = (TraceLine(2, 1, "UNKNOWN_COMMAND", "unknown command 'getSHA256'", "encodeSHA256"),)


class ScriptedClient:
    """Answers from a script of outcomes/exceptions and counts calls."""

    def __init__(self, *script: ParseOutcome | Exception) -> None:
        self.script = list(script)
        self.calls: list[tuple[str, bool]] = []

    async def validate(self, code: str, *, strict: bool = False) -> ParseOutcome:
        self.calls.append((code, strict))
        item = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(item, Exception):
            raise item
        return item


class BlockedClient:
    """Never answers until released: stands in for a hung parser."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.calls = 0

    async def validate(self, code: str, *, strict: bool = False) -> ParseOutcome:
        self.calls += 1
        self.entered.set()
        await self.release.wait()
        return ParseOutcome(valid=True)


async def test_valid_and_invalid_verdicts_carry_the_trace(clock: ManualClock) -> None:
    client = ScriptedClient(ParseOutcome(True), ParseOutcome(False, TRACE))
    guarded = GuardedParser(client, CircuitBreaker(clock=clock), strict=True)
    first = await guarded.check("addVar(a, 1)")
    second = await guarded.check("getSHA256(a, b)")
    assert first.status is CheckStatus.VALID
    assert second.status is CheckStatus.INVALID
    assert second.trace == TRACE
    assert client.calls == [("addVar(a, 1)", True), ("getSHA256(a, b)", True)]


async def test_timeout_zero_disables_validation_without_a_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="intentroute.validator")
    client = ScriptedClient(ParseOutcome(True))
    guarded = GuardedParser(client, timeout=0)
    result = await guarded.check("addVar(a, 1)")
    assert result.status is CheckStatus.UNAVAILABLE
    assert result.reason == "disabled"
    assert client.calls == []
    assert not guarded.enabled
    assert "[ptvl] parser unavailable — returning unvalidated" in caplog.text


async def test_no_client_means_unavailable() -> None:
    result = await GuardedParser(None).check("addVar(a, 1)")
    assert result.status is CheckStatus.UNAVAILABLE


async def test_three_failures_open_the_circuit_and_stop_calls(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="intentroute.validator")
    client = ScriptedClient(ParserUnavailableError("UNAVAILABLE: connection refused"))
    breaker = CircuitBreaker(3, 30, clock=clock)
    guarded = GuardedParser(client, breaker)
    for _ in range(3):
        assert (await guarded.check("addVar(a, 1)")).status is CheckStatus.UNAVAILABLE
    assert breaker.state is BreakerState.OPEN
    assert len(client.calls) == 3
    for _ in range(5):
        result = await guarded.check("addVar(a, 1)")
        assert result.reason == "circuit_open"
    assert len(client.calls) == 3  # no call while OPEN
    assert "[ptvl] circuit OPEN — skipping parser" in caplog.text
    assert "[ptvl] parser unavailable — returning unvalidated" in caplog.text


async def test_half_open_probe_success_closes_the_circuit(clock: ManualClock) -> None:
    client = ScriptedClient(
        ParserUnavailableError("down"),
        ParserUnavailableError("down"),
        ParserUnavailableError("down"),
        ParseOutcome(True),
    )
    breaker = CircuitBreaker(3, 30, clock=clock)
    guarded = GuardedParser(client, breaker)
    for _ in range(3):
        await guarded.check("x")
    clock.advance(30)
    assert (await guarded.check("addVar(a, 1)")).status is CheckStatus.VALID
    assert breaker.state is BreakerState.CLOSED
    assert len(client.calls) == 4


async def test_only_one_probe_in_flight_while_half_open(clock: ManualClock) -> None:
    breaker = open_breaker(clock)
    clock.advance(30)
    client = BlockedClient()
    guarded = GuardedParser(client, breaker, timeout=5)
    probe = asyncio.create_task(guarded.check("addVar(a, 1)"))
    await client.entered.wait()
    # While the probe hangs, other requests skip the parser.
    assert (await guarded.check("addVar(a, 1)")).reason == "circuit_open"
    assert client.calls == 1
    client.release.set()
    assert (await probe).status is CheckStatus.VALID
    assert breaker.state is BreakerState.CLOSED


async def test_a_hung_parser_times_out_and_counts_as_failure(clock: ManualClock) -> None:
    client = BlockedClient()
    breaker = CircuitBreaker(1, 30, clock=clock)
    guarded = GuardedParser(client, breaker, timeout=0.05)
    result = await guarded.check("addVar(a, 1)")
    assert (result.status, result.reason) == (CheckStatus.UNAVAILABLE, "timeout")
    assert breaker.state is BreakerState.OPEN
    client.release.set()


async def test_cancelled_probe_gives_the_permit_back(clock: ManualClock) -> None:
    breaker = open_breaker(clock)
    clock.advance(30)
    client = BlockedClient()
    guarded = GuardedParser(client, breaker, timeout=5)
    probe = asyncio.create_task(guarded.check("addVar(a, 1)"))
    await client.entered.wait()
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.allow()  # the next caller may probe


async def test_rejected_request_is_unavailable_but_not_an_outage(clock: ManualClock) -> None:
    client = ScriptedClient(ParserRejectedError("code too large"))
    breaker = CircuitBreaker(1, 30, clock=clock)
    result = await GuardedParser(client, breaker).check("x" * 10)
    assert result.status is CheckStatus.UNAVAILABLE
    assert result.reason.startswith("rejected")
    assert breaker.state is BreakerState.CLOSED


def test_guarded_parser_from_settings() -> None:
    disabled = {"AVAP_PARSER_URL": "grpc://127.0.0.1:1", "AVAP_PARSER_TIMEOUT": "0"}
    assert not build_checker(ValidatorSettings.from_env(disabled)).enabled
    guarded = build_checker(ValidatorSettings.from_env({**disabled, "AVAP_PARSER_TIMEOUT": "1.5"}))
    assert guarded.enabled
    assert guarded.timeout == 1.5
