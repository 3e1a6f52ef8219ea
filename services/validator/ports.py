"""The Protocols this service's handlers depend on; adapters implement them, tests pass fakes.

`CodeChecker` (the parser behind its guard) answers a `CheckResult`; `ParserClient` (the
parser service itself, `parser_client.GrpcParserClient`) a `ParseOutcome`."""

from __future__ import annotations

import enum
from typing import Protocol

import msgspec

from services.validator.trace import render_parser_feedback
from shared.contracts.parser import TraceLine


class ParseOutcome(msgspec.Struct, frozen=True):
    valid: bool
    trace: tuple[TraceLine, ...] = ()


class ParserClient(Protocol):
    async def validate(self, code: str, *, strict: bool = False) -> ParseOutcome: ...


class CheckStatus(enum.StrEnum):
    VALID = "VALID"
    INVALID = "INVALID"
    UNAVAILABLE = "UNAVAILABLE"  # no evidence either way: disabled, circuit open, or failed


class CheckResult(msgspec.Struct, frozen=True):
    """The validator's verdict on one program."""

    status: CheckStatus
    trace: tuple[TraceLine, ...] = ()
    # Why the result is UNAVAILABLE: "disabled" | "circuit_open" | "timeout" | the error.
    reason: str = ""

    @property
    def feedback(self) -> str:
        """The `<parser_feedback>` section for the one trace-guided retry (RC-08)."""
        return render_parser_feedback(self.trace) if self.status is CheckStatus.INVALID else ""


class CodeChecker(Protocol):
    """The parser behind its guard (`parser_client.GuardedParser`)."""

    @property
    def enabled(self) -> bool: ...

    async def check(self, code: str) -> CheckResult: ...
