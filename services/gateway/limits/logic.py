"""Per-agent limits at admission: which limits apply to an agent, and what a verdict of
the shared state means for its request (pure; the state and its arithmetic live in
Postgres, `limit_store.PgLimits`, so every gateway replica checks one count).

Checked in this order, each on the agent's own state, before anything is worked on:

1. requests per second: a token bucket of `burst` requests refilled at `rate` a second
   (RATE_LIMITED, `retry_after_ms` = until the bucket holds a request again);
2. requests in flight, from admission until the request-log row of its final chunk is
   written or its deadline passes (CONCURRENCY_LIMITED);
3. model tokens per minute, from the request log's token counts of its answered
   requests, over a sliding minute (QUOTA_EXCEEDED, until the count falls below);
4. cost units per UTC day and month, its answered requests priced with its own price
   table, plus an estimate reserved for each request in flight (BUDGET_EXCEEDED until
   the next day or month; or, with `on_budget=degrade`, admitted and answered by the
   extractive answerer, marked).
"""

from __future__ import annotations

import math
from typing import TypeVar

import msgspec

from services.gateway.limits.ports import Admission, Limits, Verdict
from services.gateway.limits.settings import LimitSettings
from shared.contracts.errors import ADMISSION_REFUSALS
from shared.contracts.response import ErrorCode
from shared.policy.agent import UNLIMITED, AgentPolicy

T = TypeVar("T", int, float)


# The final chunks of requests refused at admission (gRPC: RESOURCE_EXHAUSTED).
REFUSALS = frozenset(ADMISSION_REFUSALS)


def _own(own: T | None, default: T | None) -> T | None:
    """The agent's value, the default when it set none, None when it set `off`."""
    if own is None:
        return default
    return None if own == UNLIMITED else own


def resolve(policy: AgentPolicy, defaults: LimitSettings) -> Limits:
    """The agent's limits: its policy's, else the global defaults (LIMIT_*). A bucket
    without a size holds two seconds of its rate (at least one request)."""
    rate = _own(policy.rate, defaults.rate)
    burst: int | None = None
    if rate is not None:
        own_rate = policy.rate is not None and policy.rate != UNLIMITED
        default_burst = None if own_rate else defaults.burst
        burst = _own(policy.burst, default_burst) or max(1, math.ceil(2 * rate))
    return Limits(
        rate=rate, burst=burst,
        max_inflight=_own(policy.max_inflight, defaults.max_inflight),
        tokens_per_min=_own(policy.tokens_per_min, defaults.tokens_per_min),
        budget_day=_own(policy.budget_day, defaults.budget_day),
        budget_month=_own(policy.budget_month, defaults.budget_month),
        on_budget=policy.on_budget or defaults.on_budget,
    )


def price_table(policy: AgentPolicy) -> dict[str, list[float]]:
    """model -> [per 1k tokens in, per 1k tokens out, per compute second], as the shared
    state prices answered requests (the cost report's formula, shared.accounting)."""
    return {model: [p.input_per_1k, p.output_per_1k, p.per_compute_s]
            for model, p in policy.prices.items()}


class Refusal(msgspec.Struct, frozen=True):
    code: ErrorCode
    message: str
    retry_after_ms: int


def refusal(admission: Admission, limits: Limits) -> Refusal | None:
    """The final error chunk's code, message and retry-after for a refused request;
    None when it is admitted (degraded or not)."""
    verdict = admission.verdict
    if verdict in (Verdict.ADMIT, Verdict.DEGRADE):
        return None
    wait = admission.retry_after_ms
    when = f"; retry in {wait} ms" if wait else ""
    if verdict == Verdict.RATE_LIMITED:
        text = f"more than {limits.rate:g} requests a second (burst {limits.burst}){when}"
    elif verdict == Verdict.CONCURRENCY_LIMITED:
        text = f"{limits.max_inflight} requests in flight already; retry when one is answered"
    elif verdict == Verdict.PROBE:
        text = ("under a budget, one request at a time until the cost of one is known; "
                "retry when it is answered")
    elif verdict == Verdict.QUOTA_EXCEEDED:
        text = f"{limits.tokens_per_min} model tokens a minute used up{when}"
    else:
        text = (f"budget spent: {admission.spent_day:.4g} of {_cap(limits.budget_day)} "
                f"today, {admission.spent_month:.4g} of {_cap(limits.budget_month)} this "
                f"month, {admission.reserved:.4g} reserved in flight{when}")
    code = ErrorCode.CONCURRENCY_LIMITED if verdict == Verdict.PROBE else ErrorCode(verdict)
    return Refusal(code, text, wait)


def _cap(budget: float | None) -> str:
    return "unlimited" if budget is None else f"{budget:g}"
