"""One error model for the whole request path, and one table of what each code is at
every door.

Every failure a component raises while serving a request is an `IntentrouteError`: it
carries its `code` (an `ErrorCode`: what the caller reads as a final chunk's
`error.code`, a feedback ack's `error_code`, a door's error body) and `retryable`
(whether asking again, unchanged, can succeed: an outage, a timeout, a limit that
passes; never for bad input or a refusal that holds). `RetryableError` and
`PermanentError` are the two kinds; an error class of its own (one per failure, with a
stable message) subclasses one of them, or sets both attributes itself. A stage retries
a retryable error (nack, redelivery) and answers a permanent one at once
(shared.runtime.stage); a door answers either with the protocol status of its code.

`DOOR_STATUS` is the one mapping of a code to each door's protocol: the HTTP status (the
feedback route and the OpenAI-compatible door alike), the OpenAI error `type` (and, where
OpenAI has a code of its own for the failure, that `code` and `param`: a caller's SDK
tells them apart by it), and the gRPC status (by name: `grpc.StatusCode[...]`; this
module imports no gRPC). Every `ErrorCode` has a row (tests/unit/test_error_model.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from shared.contracts.response import ErrorCode, ErrorInfo

__all__ = [
    "ADMISSION_REFUSALS",
    "DOOR_STATUS",
    "DoorStatus",
    "ErrorCode",
    "IntentrouteError",
    "InvalidInputError",
    "PermanentError",
    "RetryableError",
    "UnauthenticatedError",
    "UnknownModelError",
    "door_status",
]


# The codes of a request refused at admission by a per-agent limit (the gateway's final
# chunk, `retry_after_ms` saying when to ask again): nothing was worked on.
ADMISSION_REFUSALS: tuple[ErrorCode, ...] = (
    ErrorCode.RATE_LIMITED, ErrorCode.CONCURRENCY_LIMITED, ErrorCode.QUOTA_EXCEEDED,
    ErrorCode.BUDGET_EXCEEDED)


class IntentrouteError(Exception):
    """A failure with its code and whether a retry can help (module doc)."""

    code: ErrorCode = ErrorCode.STAGE_FAILED
    retryable: bool = False

    def __init__(self, message: str = "", *, code: ErrorCode | str | None = None,
                 retry_after_ms: int = 0) -> None:
        """`code`: this failure's, when its class names none (or another); `retry_after_ms`:
        when asking again can succeed (0: not said)."""
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = ErrorCode(code)
        self.retry_after_ms = retry_after_ms

    @property
    def info(self) -> ErrorInfo:
        """As a final chunk carries it."""
        return ErrorInfo(self.code, self.message, retry_after_ms=self.retry_after_ms)


class RetryableError(IntentrouteError):
    """Asking again, unchanged, can succeed (an outage, a timeout, a limit that passes)."""

    retryable = True


class PermanentError(IntentrouteError):
    """The request cannot succeed however often it is retried."""

    retryable = False


class InvalidInputError(PermanentError):
    """What a caller sent does not check: one of the input codes (MALFORMED_JSON,
    MISSING_FIELD, INVALID_FIELD, OVERSIZED_FIELD, UNKNOWN_QUERY_TYPE, AGENT_MISMATCH),
    the request id it named if one can address an answer, the field at fault if known."""

    code = ErrorCode.INVALID_FIELD

    def __init__(self, code: ErrorCode | str, message: str, request_id: str = "", *,
                 param: str | None = None) -> None:
        super().__init__(message, code=code)
        self.request_id = request_id
        self.param = param


class UnauthenticatedError(PermanentError):
    """No credential, or not a valid one."""

    code = ErrorCode.UNAUTHENTICATED


class UnknownModelError(InvalidInputError):
    """A model the request names (`AgentRequest.model`, the OpenAI door's `model`) that
    its agent may not choose (its policy's `models=`) or the fleet does not serve."""

    code = ErrorCode.UNKNOWN_MODEL

    def __init__(self, message: str, request_id: str = "") -> None:
        super().__init__(ErrorCode.UNKNOWN_MODEL, message, request_id, param="model")


class DoorStatus(NamedTuple):
    """What a code is at each door: HTTP status, OpenAI error type, gRPC status name;
    OpenAI's own `code` and `param` for it when OpenAI has one (else the code itself,
    and the field the error names, if any)."""

    http: int
    openai: str
    grpc: str
    openai_code: str = ""
    openai_param: str | None = None


_INPUT = DoorStatus(400, "invalid_request_error", "INVALID_ARGUMENT")
_INTERNAL = DoorStatus(500, "server_error", "INTERNAL")
_REFUSED = DoorStatus(429, "rate_limit_error", "RESOURCE_EXHAUSTED")
_UNAVAILABLE = DoorStatus(503, "server_error", "UNAVAILABLE")

DOOR_STATUS: Mapping[ErrorCode, DoorStatus] = {
    ErrorCode.MALFORMED_JSON: _INPUT,
    ErrorCode.MISSING_FIELD: _INPUT,
    ErrorCode.INVALID_FIELD: _INPUT,
    ErrorCode.OVERSIZED_FIELD: DoorStatus(413, "invalid_request_error", "INVALID_ARGUMENT"),
    ErrorCode.UNKNOWN_QUERY_TYPE: _INPUT,
    ErrorCode.DUPLICATE_REQUEST: DoorStatus(409, "invalid_request_error", "ALREADY_EXISTS"),
    ErrorCode.BAD_ENVELOPE: _INTERNAL,
    ErrorCode.NOT_ADMITTED: _INTERNAL,
    ErrorCode.STAGE_FAILED: _INTERNAL,
    ErrorCode.DEADLINE_EXCEEDED: DoorStatus(504, "server_error", "DEADLINE_EXCEEDED"),
    ErrorCode.RC04_VIOLATION: _INTERNAL,
    ErrorCode.AGENT_MISMATCH: DoorStatus(403, "permission_error", "PERMISSION_DENIED"),
    ErrorCode.UNKNOWN_AGENT: DoorStatus(403, "permission_error", "PERMISSION_DENIED"),
    ErrorCode.BACKEND_UNAVAILABLE: _UNAVAILABLE,
    # A provider's content filter refused the request itself: not the server's failing.
    ErrorCode.CONTENT_FILTERED: DoorStatus(400, "invalid_request_error", "FAILED_PRECONDITION"),
    ErrorCode.UNKNOWN_REQUEST: DoorStatus(404, "invalid_request_error", "NOT_FOUND"),
    ErrorCode.STORE_UNAVAILABLE: _UNAVAILABLE,
    ErrorCode.RATE_LIMITED: _REFUSED,
    ErrorCode.CONCURRENCY_LIMITED: _REFUSED,
    ErrorCode.BUDGET_EXCEEDED: _REFUSED,
    ErrorCode.QUOTA_EXCEEDED: _REFUSED,
    ErrorCode.QUEUE_FULL: _REFUSED,
    ErrorCode.BUS_UNAVAILABLE: _UNAVAILABLE,
    ErrorCode.THROTTLED: _REFUSED,
    ErrorCode.UNAUTHENTICATED: DoorStatus(401, "authentication_error", "UNAUTHENTICATED"),
    # OpenAI's own answer to a model it does not serve: 404 `model_not_found`.
    ErrorCode.UNKNOWN_MODEL: DoorStatus(404, "invalid_request_error", "NOT_FOUND",
                                        openai_code="model_not_found", openai_param="model"),
    # The OpenAI door's stream after a restart of text it sent (the protocol has no way
    # to take it back): never a final chunk's code. Ask again.
    ErrorCode.ANSWER_RESTARTED: DoorStatus(502, "server_error", "ABORTED"),
}


def door_status(code: str) -> DoorStatus:
    """A code's row; a code this version does not know (a newer worker's) is an
    internal error."""
    try:
        return DOOR_STATUS[ErrorCode(code)]
    except ValueError:
        return _INTERNAL
