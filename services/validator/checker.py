"""The validator's view of the parser: breaker + timeout + gRPC client -> a verdict."""

from __future__ import annotations

from services.validator.breaker import CircuitBreaker
from services.validator.feedback import render_parser_feedback
from services.validator.handlers import Outcome, Verdict
from services.validator.parser_client import CheckStatus, GrpcParserClient, GuardedParser
from services.validator.settings import ValidatorSettings


class ParserChecker:
    def __init__(self, guarded: GuardedParser) -> None:
        self.guarded = guarded

    @classmethod
    def from_settings(cls, settings: ValidatorSettings) -> ParserChecker:
        client = GrpcParserClient(settings.parser_url, timeout=settings.parser_timeout)
        breaker = CircuitBreaker(settings.cb_threshold, settings.cb_cooldown)
        return cls(GuardedParser(client, breaker, timeout=settings.parser_timeout,
                                 strict=settings.strict))

    @property
    def enabled(self) -> bool:
        return self.guarded.enabled

    async def verdict(self, code: str) -> Verdict:
        result = await self.guarded.check(code)
        if result.status == CheckStatus.VALID:
            return Verdict(Outcome.VALID)
        if result.status == CheckStatus.INVALID:
            return Verdict(Outcome.INVALID, render_parser_feedback(result.trace))
        return Verdict(Outcome.UNAVAILABLE)

    async def close(self) -> None:
        await self.guarded.close()
