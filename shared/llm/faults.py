"""Every way a model server fails, named once, with what the chain does about it.

A client (shared.llm.ollama, shared.llm.openai) raises `ModelError` with a `Fault`; the
chain walker (shared.llm.walk) times the stream itself (first byte, first token, the
gaps between tokens). One outcome per fault, the same on every door:

- RATE_LIMITED (429 + Retry-After): waited for when it fits the deadline, else the next
  step;
- OVERLOADED (429/503 without it): bounded attempts, jittered backoff (>= 0.3 s apart),
  then the next step;
- SERVER_ERROR (500, 502, 504) and RESET (the connection dropped before any byte): one
  retry on the same model, then the next step;
- UNREACHABLE (connection refused, DNS), REFUSED (401, 403, 404, another 4xx),
  NO_RESPONSE (no first byte in time): the next step, no retry (a silent server is not
  asked again by the request);
- SLOW (no first token within the agent's ttft): the late stream is cancelled; the next
  step;
- STALLED (no token within stall_ms), CUT (the stream broke mid-answer): continued by
  the next step from what was sent when that model takes a prefill, else restarted
  cleanly;
- CONTEXT_LENGTH (400: the prompt is too long): no retry; the next step with a larger
  context;
- CONTENT_FILTER: no retry; a typed final error with the provider's reason;
- CIRCUIT_OPEN (the backend failed again and again): straight to the next step.

A malformed chunk in the middle of a stream is skipped and logged, never passed on; a
stream that ends without its end marker is finalised at once with what came.
"""

from __future__ import annotations

import enum
import re

from shared.llm.ports import BackendUnavailableError


class Fault(enum.StrEnum):
    RATE_LIMITED = "rate_limited"
    OVERLOADED = "overloaded"
    SERVER_ERROR = "server_error"
    RESET = "reset"
    UNREACHABLE = "unreachable"
    REFUSED = "refused"
    NO_RESPONSE = "no_response"
    SLOW = "slow"
    STALLED = "stalled"
    CUT = "cut"
    CONTEXT_LENGTH = "context_length"
    CONTENT_FILTER = "content_filter"
    CIRCUIT_OPEN = "circuit_open"
    # A prefill the model refused (400 on a continuation): the step restarts instead.
    PREFILL_REFUSED = "prefill_refused"


# The earlier steps are *down* (an `if_unavailable` step may follow them): refused,
# unreachable, 5xx, silent, circuit open, broken mid-stream. Not when merely slow.
DOWN = frozenset({Fault.RATE_LIMITED, Fault.OVERLOADED, Fault.SERVER_ERROR, Fault.RESET,
                  Fault.UNREACHABLE, Fault.REFUSED, Fault.NO_RESPONSE, Fault.CUT,
                  Fault.CIRCUIT_OPEN})
# What counts against a backend's circuit (its server failing, not the request).
COUNTS_AGAINST_BACKEND = frozenset({Fault.OVERLOADED, Fault.SERVER_ERROR, Fault.RESET,
                                    Fault.UNREACHABLE, Fault.NO_RESPONSE, Fault.CUT,
                                    Fault.STALLED})
# Mid-answer: the next step continues or restarts what was sent.
MID_STREAM = frozenset({Fault.CUT, Fault.STALLED})


class ModelError(BackendUnavailableError):
    """A model call failed as `fault` (module doc); `retry_after` seconds when the
    server said (429/503 Retry-After); `sent` whether any token had come."""

    def __init__(self, fault: Fault, detail: str, *, retry_after: float | None = None,
                 status: int | None = None) -> None:
        super().__init__(f"{fault}: {detail}")
        self.fault = fault
        self.detail = detail
        self.retry_after = retry_after
        self.status = status


_CONTEXT = re.compile(r"context[_ ]length|maximum context|too many tokens|context window|"
                      r"exceeds? the (model's )?context", re.IGNORECASE)
_FILTER = re.compile(r"content[_ ](filter|policy|management)|safety system|flagged",
                     re.IGNORECASE)


def retry_after_seconds(value: str | None) -> float | None:
    """A Retry-After header in seconds (delta-seconds form; an HTTP date is not kept)."""
    if not value:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def classify_status(status: int, body: str, retry_after: str | None = None) -> ModelError:
    """The fault an HTTP error answer of a model server is."""
    detail = f"HTTP {status}: {' '.join(body.split())[:200]}"
    after = retry_after_seconds(retry_after)
    if status == 429:
        fault = Fault.RATE_LIMITED if after is not None else Fault.OVERLOADED
        return ModelError(fault, detail, retry_after=after, status=status)
    if status == 503:
        return ModelError(Fault.OVERLOADED, detail, retry_after=after, status=status)
    if status >= 500:
        return ModelError(Fault.SERVER_ERROR, detail, status=status)
    if _FILTER.search(body):
        return ModelError(Fault.CONTENT_FILTER, detail, status=status)
    if _CONTEXT.search(body):
        return ModelError(Fault.CONTEXT_LENGTH, detail, status=status)
    return ModelError(Fault.REFUSED, detail, status=status)
