"""Per-agent policy (ADR-0006), stored in `agent_policies` and set with
`intentroute agent set NAME key=value ...`; workers re-read it periodically.

Keys (an empty value unsets one):

    clarity_threshold=0.7          below it a decision NEEDS_CLARIFICATION (global: 0.65)
    clarity_policy=ask|proceed     what the classifier does then
    fallback.main=MODEL,...,extractive|error
                                   the ordered chain of a model slot; it ends in the
                                   extractive answer or an explicit error
    slo_p95_ms=500                 latency SLO
    price.MODEL=IN,OUT[,COMPUTE_S] price per 1k input / output tokens and per compute
                                   second (local models)
"""

from __future__ import annotations

import enum
import json
from typing import Any

import msgspec


class PolicyError(ValueError):
    """A policy assignment that cannot be applied (the message says why)."""


class ClarityPolicy(enum.StrEnum):
    PROCEED = "proceed"
    ASK = "ask"


class FallbackEnd(enum.StrEnum):
    """The terminal step of a fallback chain."""

    EXTRACTIVE = "extractive"
    ERROR = "error"


class Price(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    input_per_1k: float = 0.0
    output_per_1k: float = 0.0
    per_compute_s: float = 0.0


class AgentPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    clarity_threshold: float | None = None
    clarity_policy: ClarityPolicy | None = None
    # Model slot ("main", "conversational") -> ordered steps: model names, then one
    # FallbackEnd as the last step.
    fallback: dict[str, list[str]] = {}
    slo_p95_ms: float | None = None
    prices: dict[str, Price] = {}


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


def fallback_chain(key: str, value: str) -> list[str]:
    steps = [step.strip() for step in value.split(",")]
    if not steps or any(not step for step in steps):
        raise PolicyError(f"{key}: empty step in {value!r}")
    ends = {end.value for end in FallbackEnd}
    if steps[-1] not in ends:
        raise PolicyError(f"{key}: the chain must end in 'extractive' or 'error'")
    if any(step in ends for step in steps[:-1]):
        raise PolicyError(f"{key}: 'extractive' / 'error' may only be the last step")
    return steps


def apply_assignment(policy: AgentPolicy, assignment: str) -> AgentPolicy:
    """`policy` with one `key=value` applied (validated)."""
    key, sep, value = assignment.partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not key:
        raise PolicyError(f"{assignment!r}: expected key=value")
    replace = msgspec.structs.replace
    if key == "clarity_threshold":
        return replace(policy, clarity_threshold=(
            _number(key, value, low=0.0, high=1.0) if value else None))
    if key == "clarity_policy":
        if value and value not in ClarityPolicy.__members__.values():
            raise PolicyError(f"{key}: {value!r} is not one of proceed, ask")
        return replace(policy, clarity_policy=ClarityPolicy(value) if value else None)
    if key == "slo_p95_ms":
        return replace(policy, slo_p95_ms=_number(key, value, low=0.0) if value else None)
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
    raise PolicyError(f"unknown policy key {key!r}")


def decode_policy(raw: str | bytes | dict[str, Any]) -> AgentPolicy:
    """A stored policy (JSON text or a decoded object)."""
    if isinstance(raw, dict):
        return msgspec.convert(raw, AgentPolicy)
    return msgspec.json.decode(raw, type=AgentPolicy)


def encode_policy(policy: AgentPolicy) -> str:
    return json.dumps(msgspec.to_builtins(policy), sort_keys=True)
