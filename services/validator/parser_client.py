"""Talking to the AVAP Parser service, and the guard that makes it a soft dependency.

`GrpcParserClient` is a thin gRPC adapter; `GuardedParser` adds what ADR-0009 requires of
the production path: a per-call timeout, the circuit breaker, `AVAP_PARSER_TIMEOUT=0` as
"validation disabled", and a three-way result (VALID / INVALID + trace / UNAVAILABLE) that
never raises because the parser is down.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from services.validator.breaker import CircuitBreaker
from services.validator.ports import CheckResult, CheckStatus, ParseOutcome, ParserClient
from shared.common.deadline import time_left
from shared.contracts.errors import RetryableError
from shared.contracts.parser import TraceLine
from shared.contracts.response import ErrorCode
from shared.grpc import avap_parser_pb2, avap_parser_pb2_grpc

log = logging.getLogger("intentroute.validator")

DEFAULT_TIMEOUT = 2.0  # seconds per call (ADR-0007 parser SLA)

# Reconnect quickly once the parser is back: with gRPC's default backoff (up to 120 s) a
# half-open probe could fail on a stale TRANSIENT_FAILURE although the server is up again.
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class ParserError(RetryableError):
    """The parser did not produce a verdict (GuardedParser answers UNAVAILABLE: never
    raised past it)."""

    code = ErrorCode.BACKEND_UNAVAILABLE


class ParserUnavailableError(ParserError):
    """Unreachable, timed out or failing: counts against the circuit breaker. `status`:
    the gRPC status it failed with, if any."""

    def __init__(self, message: str, status: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.status = status


class ParserRejectedError(ParserError):
    """The parser is up but refused this request (e.g. code too large)."""

    code = ErrorCode.STAGE_FAILED
    retryable = False


def grpc_target(url: str) -> str:
    """`grpc://host:port` or `host:port` -> `host:port`."""
    url = url.strip()
    if url.startswith("grpc://"):
        url = url[len("grpc://") :]
    if not url or "://" in url:
        raise ValueError(f"expected grpc://host:port or host:port, got {url!r}")
    return url.rstrip("/")


class GrpcParserClient:
    """ParserClient over grpc.aio. The channel is opened lazily, on the running loop."""

    def __init__(self, url: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.target = grpc_target(url)
        self.timeout = timeout
        self._channel: grpc.aio.Channel | None = None
        self._stub: avap_parser_pb2_grpc.AvapParserStub | None = None

    def _get_stub(self) -> avap_parser_pb2_grpc.AvapParserStub:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(self.target, options=_CHANNEL_OPTIONS)
            # The generated stub is untyped (grpc_tools emits no annotations).
            self._stub = avap_parser_pb2_grpc.AvapParserStub(  # type: ignore[no-untyped-call]
                self._channel)
        return self._stub

    async def validate(self, code: str, *, strict: bool = False) -> ParseOutcome:
        request = avap_parser_pb2.ValidateRequest(code=code, strict=strict)
        try:
            response = await self._get_stub().Validate(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            status = exc.code()
            if status is grpc.StatusCode.INVALID_ARGUMENT:
                raise ParserRejectedError(exc.details() or "rejected") from exc
            raise ParserUnavailableError(f"{status.name}: {exc.details()}", status) from exc
        except (OSError, TimeoutError) as exc:
            raise ParserUnavailableError(f"{type(exc).__name__}: {exc}") from exc
        return ParseOutcome(
            valid=response.valid,
            trace=tuple(
                TraceLine(t.line, t.column, t.code, t.message, t.suggestion) for t in response.trace
            ),
        )

    async def close(self) -> None:
        if self._channel is not None:
            channel, self._channel, self._stub = self._channel, None, None
            await channel.close()


class GuardedParser:
    """Parser calls behind the breaker and the timeout; `check` never raises for outages."""

    def __init__(
        self,
        client: ParserClient | None,
        breaker: CircuitBreaker | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        strict: bool = False,
    ) -> None:
        self.client = client
        self.breaker = breaker or CircuitBreaker()
        self.timeout = timeout
        # Lenient by default: the runtime accepts the Lite dialect (expression assignments),
        # which the knowledge base documents as an extension; both modes flag hallucinated
        # commands and foreign syntax.
        self.strict = strict

    @property
    def enabled(self) -> bool:
        return self.client is not None and self.timeout > 0

    async def check(self, code: str) -> CheckResult:
        if self.client is None or self.timeout <= 0:
            return self._unavailable("disabled")
        if not self.breaker.allow():
            return self._unavailable("circuit_open")
        try:
            async with asyncio.timeout(time_left(self.timeout)):
                outcome = await self.client.validate(code, strict=self.strict)
        except asyncio.CancelledError:
            self.breaker.release()
            raise
        except TimeoutError:
            self.breaker.record_failure()
            return self._unavailable("timeout")
        except ParserRejectedError as exc:
            # The service answered, so it is reachable; it just gave no verdict.
            self.breaker.record_success()
            return self._unavailable(f"rejected: {exc}")
        except ParserError as exc:
            self.breaker.record_failure()
            return self._unavailable(str(exc) or type(exc).__name__)
        except Exception:
            # A bug, not an outage: surface it, but never keep a half-open probe permit.
            self.breaker.release()
            raise
        self.breaker.record_success()
        if outcome.valid:
            return CheckResult(CheckStatus.VALID, outcome.trace)
        return CheckResult(CheckStatus.INVALID, outcome.trace)

    def _unavailable(self, reason: str) -> CheckResult:
        # RC-07: every unvalidated CODE_GENERATION answer is logged. Expected states
        # (disabled, circuit open) at INFO, actual failures at WARNING.
        level = logging.INFO if reason in ("disabled", "circuit_open") else logging.WARNING
        log.log(level, "[ptvl] parser unavailable — returning unvalidated (%s)", reason)
        return CheckResult(CheckStatus.UNAVAILABLE, reason=reason)

    async def close(self) -> None:
        close = getattr(self.client, "close", None)
        if close is not None:
            await close()
