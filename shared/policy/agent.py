"""Per-agent policy (ADR-0006), stored in `agent_policies` and set with
`intentroute agent set NAME key=value ...`; workers re-read it periodically.

Keys (an empty value unsets one):

    clarity_threshold=0.7          below it a decision NEEDS_CLARIFICATION (global: 0.65)
    clarity_policy=ask|proceed     what the classifier does then
    fallback.main=STEP,...,extractive|error
                                   the ordered chain of a model slot after the slot's
                                   own model; a step is `backend/model`, optionally
                                   `@if_unavailable` or `@within=2s` (shared.policy.
                                   chain); it ends in the extractive answer or an
                                   explicit error
    ttft_ms=2000 stall_ms=500      a model's first token and its gaps between tokens:
                                   past either the chain's next step answers (global:
                                   LLM_TTFT_MS, LLM_STALL_MS)
    models=cloud/big-1,local/small the fleet models the agent may name as `model` at
                                   the OpenAI door (routing and the chain still apply)
    multi_intent=split|ask|first   a message carrying several requests: answered part
                                   by part, asked to be sent one by one, or its first
                                   request only (global: CLASSIFIER_MULTI_INTENT)
    slo_p95_ms=500                 latency SLO
    price.MODEL=IN,OUT[,COMPUTE_S] price per 1k input / output tokens and per compute
                                   second (local models)
    currency=EUR                   the prices' currency (ISO 4217 code), shown with costs
    rate=20/s burst=40             requests per second (or /min, /hour) and the bucket
    max_inflight=8                 requests admitted and not yet answered
    tokens_per_min=20000           model tokens (in + out) per minute
    budget_day=5.0 budget_month=100
                                   cost units (from the prices) per UTC day / month
    on_budget=refuse|degrade       past a budget: BUDGET_EXCEEDED, or the extractive answer
    weight=1                       the agent's share in the gateway's fair scheduling
    cache=on cache_ttl=1h cache_group=NAME
                                   the answer cache (shared.policy.cache)
Limits left unset take the gateway's global defaults (LIMIT_*); `off` turns one off
for the agent whatever the default.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Callable
from typing import Any

import msgspec

from shared.policy.cache import KEYS as CACHE_KEYS
from shared.policy.cache import CacheKeyError, cache_fields
from shared.policy.chain import ChainError, check_chain, split_ref


class PolicyError(ValueError):
    """A policy assignment that cannot be applied (the message says why)."""


class ClarityPolicy(enum.StrEnum):
    PROCEED = "proceed"
    ASK = "ask"


class FallbackEnd(enum.StrEnum):
    """The terminal step of a fallback chain."""

    EXTRACTIVE = "extractive"
    ERROR = "error"


class MultiIntent(enum.StrEnum):
    """What the classifier does with a message carrying several requests (issue 34)."""

    SPLIT = "split"  # each part routed and answered in order, in one stream
    ASK = "ask"  # ask the user to send them one by one (the clarity gate's question)
    FIRST = "first"  # answer the first request only


class OnBudget(enum.StrEnum):
    """What the gateway does with a request of an agent past its budget."""

    REFUSE = "refuse"  # a final BUDGET_EXCEEDED error chunk
    DEGRADE = "degrade"  # the extractive answerer answers, marked (no model cost)


# A limit set to this is off for the agent, whatever the global default says.
UNLIMITED = -1


class Price(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    input_per_1k: float = 0.0
    output_per_1k: float = 0.0
    per_compute_s: float = 0.0


def price_of(prices: dict[str, Price], model: str) -> Price | None:
    """A model's price: under its `backend/model` name, else under the model's own name
    (prices set before models were named by their backend)."""
    found = prices.get(model)
    if found is None and "/" in model:
        found = prices.get(model.partition("/")[2])
    return found


class AgentPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    clarity_threshold: float | None = None
    clarity_policy: ClarityPolicy | None = None
    # Model slot ("main", "conversational") -> ordered steps: model names, then one
    # FallbackEnd as the last step.
    fallback: dict[str, list[str]] = {}
    slo_p95_ms: float | None = None
    prices: dict[str, Price] = {}
    # The prices' currency (ISO 4217, e.g. EUR); None: plain cost units.
    currency: str | None = None
    # Admission limits (services/gateway/limits.py). None: the global default (LIMIT_*);
    # UNLIMITED (-1): off for this agent.
    rate: float | None = None  # requests per second (token bucket refill)
    burst: int | None = None  # the bucket's size
    max_inflight: int | None = None
    tokens_per_min: int | None = None
    budget_day: float | None = None  # cost units per UTC day
    budget_month: float | None = None  # cost units per UTC month
    on_budget: OnBudget | None = None
    # The agent's share in the gateway's weighted fair scheduling (stored and
    # validated here; the scheduler reads it).
    weight: float | None = None
    # A message carrying several requests: split, ask or first (None: the global
    # CLASSIFIER_MULTI_INTENT).
    multi_intent: MultiIntent | None = None
    # Latency targets of its model calls (shared.llm.walk.Timing); None: the globals.
    ttft_ms: float | None = None
    stall_ms: float | None = None
    # Fleet models (`backend/model`) it may choose at the OpenAI door.
    models: list[str] = []
    # The answer cache (shared.policy.cache): on for this agent (None: off), how long an
    # answer serves (seconds; None: ANSWER_CACHE_TTL), the sharing group it joined.
    cache: bool | None = None
    cache_ttl: float | None = None
    cache_group: str | None = None


SLOTS = ("main", "conversational")


def _number(key: str, value: str, *, low: float, high: float | None = None) -> float:
    try:
        number = float(value)
    except ValueError:
        raise PolicyError(f"{key}: {value!r} is not a number") from None
    if number != number or number < low or (high is not None and number > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise PolicyError(f"{key}: {value} must be {bound}")
    return number


_UNITS = {"s": "second", "sec": "second", "m": "minute", "min": "minute", "h": "hour",
          "d": "day"}


def per_second(key: str, value: str) -> float:
    """A rate as requests per second: `20`, `20/s`, `1200/min`, `5 per 10 seconds` (the
    `limits` library's notation, plus the short units s, sec, m, min, h, d)."""
    import limits  # the policy module stays importable without it for the other keys

    amount, sep, unit = value.partition("/")
    text = f"{amount}/{_UNITS.get(unit.strip(), unit.strip())}" if sep else value
    try:
        item = limits.parse(text) if (sep or " " in value) else None
    except ValueError:
        raise PolicyError(f"{key}: {value!r} is not a rate (e.g. 20/s, 1200/min)") from None
    rate = item.amount / item.get_expiry() if item else _number(key, value, low=0.0)
    if rate <= 0:
        raise PolicyError(f"{key}: {value} must be more than 0 (or off)")
    return rate


# Limit key -> parser of its value; "off" is UNLIMITED, "" the global default.
_LIMITS: dict[str, Callable[[str, str], float]] = {
    "rate": per_second,
    "burst": lambda key, value: _whole(key, value),
    "max_inflight": lambda key, value: _whole(key, value),
    "tokens_per_min": lambda key, value: _whole(key, value),
    "budget_day": lambda key, value: _number(key, value, low=0.0),
    "budget_month": lambda key, value: _number(key, value, low=0.0),
}


def _whole(key: str, value: str) -> int:
    number = _number(key, value, low=1.0, high=1e12)
    if number != int(number):
        raise PolicyError(f"{key}: {value} must be a whole number")
    return int(number)


def _limit(policy: AgentPolicy, key: str, value: str) -> AgentPolicy:
    """One of the admission keys (limits, on_budget, weight) applied."""
    if key == "on_budget":
        if value and value not in OnBudget.__members__.values():
            raise PolicyError(f"{key}: {value!r} is not one of refuse, degrade")
        return msgspec.structs.replace(policy, on_budget=OnBudget(value) if value else None)
    if key == "weight":
        return msgspec.structs.replace(
            policy, weight=_number(key, value, low=0.01, high=1000.0) if value else None)
    number = (None if not value else UNLIMITED if value.lower() == "off"
              else _LIMITS[key](key, value))
    if number is not None and not math.isfinite(number):
        raise PolicyError(f"{key}: {value} is not a finite number")
    return msgspec.structs.replace(policy, **{key: number})


def _reporting(policy: AgentPolicy, key: str, value: str) -> AgentPolicy:
    """One of the keys reports read (the SLO, the prices' currency) applied."""
    if key == "slo_p95_ms":
        return msgspec.structs.replace(
            policy, slo_p95_ms=_number(key, value, low=0.0) if value else None)
    code = value.upper()
    if value and not (len(code) == 3 and code.isascii() and code.isalpha()):
        raise PolicyError(f"{key}: {value!r} is not a currency code (e.g. EUR, USD)")
    return msgspec.structs.replace(policy, currency=code or None)


def _cache(policy: AgentPolicy, key: str, value: str) -> AgentPolicy:
    """One of the answer cache's keys applied (shared.policy.cache)."""
    try:
        return msgspec.structs.replace(policy, **cache_fields(key, value))
    except CacheKeyError as exc:
        raise PolicyError(str(exc)) from None


def fallback_chain(key: str, value: str) -> list[str]:
    steps = [step.strip() for step in value.split(",")]
    try:
        check_chain(steps)
    except ChainError as exc:
        raise PolicyError(f"{key}: {exc}") from None
    return steps


def _clarity(policy: AgentPolicy, key: str, value: str) -> AgentPolicy:
    """One of the keys of what the classifier does with an unclear or a multi-part
    message (the threshold, the policy, multi-intent)."""
    replace = msgspec.structs.replace
    if key == "clarity_threshold":
        return replace(policy, clarity_threshold=(
            _number(key, value, low=0.0, high=1.0) if value else None))
    if key == "clarity_policy":
        if value and value not in ClarityPolicy.__members__.values():
            raise PolicyError(f"{key}: {value!r} is not one of proceed, ask")
        return replace(policy, clarity_policy=ClarityPolicy(value) if value else None)
    if value and value not in MultiIntent.__members__.values():
        raise PolicyError(f"{key}: {value!r} is not one of split, ask, first")
    return replace(policy, multi_intent=MultiIntent(value) if value else None)


def _model_calls(policy: AgentPolicy, key: str, value: str) -> AgentPolicy:
    """One of the keys of the agent's model calls (latency targets, door models)."""
    if key == "models":
        return msgspec.structs.replace(policy, models=_models(key, value))
    number = _number(key, value, low=1.0) if value else None
    return msgspec.structs.replace(policy, **{key: number})


def _models(key: str, value: str) -> list[str]:
    refs = [part.strip() for part in value.split(",") if part.strip()]
    for ref in refs:
        try:
            split_ref(ref)
        except ChainError as exc:
            raise PolicyError(f"{key}: {exc}") from None
    return refs


def apply_assignment(policy: AgentPolicy, assignment: str) -> AgentPolicy:
    """`policy` with one `key=value` applied (validated)."""
    key, sep, value = assignment.partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not key:
        raise PolicyError(f"{assignment!r}: expected key=value")
    replace = msgspec.structs.replace
    if key in _LIMITS or key in ("on_budget", "weight"):
        return _limit(policy, key, value)
    if key in ("clarity_threshold", "clarity_policy", "multi_intent"):
        return _clarity(policy, key, value)
    if key in ("slo_p95_ms", "currency"):
        return _reporting(policy, key, value)
    if key in ("ttft_ms", "stall_ms", "models"):
        return _model_calls(policy, key, value)
    if key in CACHE_KEYS:
        return _cache(policy, key, value)
    head, _, name = key.partition(".")
    if head == "fallback" and name:
        if name not in SLOTS:
            raise PolicyError(f"{key}: unknown model slot {name!r} (main, conversational)")
        chains = dict(policy.fallback)
        if value:
            chains[name] = fallback_chain(key, value)
        else:
            chains.pop(name, None)
        return replace(policy, fallback=chains)
    if head == "price" and name:
        prices = dict(policy.prices)
        if value:
            parts = value.split(",")
            if len(parts) not in (2, 3):
                raise PolicyError(f"{key}: expected IN,OUT[,COMPUTE_S] per 1k tokens")
            numbers = [_number(key, part.strip(), low=0.0) for part in parts]
            prices[name] = Price(*numbers)
        else:
            prices.pop(name, None)
        return replace(policy, prices=prices)
    raise PolicyError(f"unknown policy key {key!r}; the keys: {', '.join(POLICY_KEYS)}")


# Every key `apply_assignment` takes (`fallback.SLOT` and `price.MODEL` name a slot, a
# model), as `intentroute agent set` lists them.
POLICY_KEYS: tuple[str, ...] = (
    "clarity_threshold", "clarity_policy", "fallback.SLOT", "slo_p95_ms", "currency",
    "ttft_ms", "stall_ms", "models", "price.MODEL", *_LIMITS, "on_budget", "weight")


def decode_policy(raw: str | bytes | dict[str, Any]) -> AgentPolicy:
    """A stored policy (JSON text or a decoded object)."""
    if isinstance(raw, dict):
        return msgspec.convert(raw, AgentPolicy)
    return msgspec.json.decode(raw, type=AgentPolicy)


def encode_policy(policy: AgentPolicy) -> str:
    return json.dumps(msgspec.to_builtins(policy), sort_keys=True)
