"""A chain of models (ADR-0006): the steps a request walks, each with its condition.

Written as `agent set NAME fallback.main=STEP,...,extractive|error`, a step being
`backend/model` with an optional condition after `@`:

- `ollama/qwen3:1.7b` — always tried when reached;
- `cloud/big-1@if_unavailable` — only when every earlier model step was *down*
  (refused, unreachable, 5xx, silent, circuit open, broken mid-stream), not when one
  was merely slow;
- `cloud/big-1@within=2s` (or `=500ms`) — only while the request is younger than that,
  and its first token must come before then: a step whose first token has not come
  within the latency it is given hands over to the next.

A model named without a backend (`m1`, the form before fleets) is that model on the
slot's own backend. The chain ends in `extractive` (the extractive answerer) or `error`
(an explicit BACKEND_UNAVAILABLE); the slot's model is always the first step.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from shared.contracts.errors import UnknownModelError

if TYPE_CHECKING:  # shared.policy.agent imports this module
    from shared.policy.agent import AgentPolicy

EXTRACTIVE = "extractive"
ERROR = "error"
ENDS = (EXTRACTIVE, ERROR)


class ChainError(ValueError):
    """A chain that cannot be walked (the message says why)."""


def split_ref(ref: str) -> tuple[str, str]:
    """`backend/model` -> (backend, model): the backend is the part before the first
    `/` (model names may hold `/`); ChainError when it is not one."""
    backend, sep, model = ref.partition("/")
    if not sep or not backend or not model:
        raise ChainError(f"{ref!r}: name a model as backend/model (e.g. ollama/qwen3:1.7b)")
    return backend, model


class Condition(enum.StrEnum):
    ALWAYS = "always"
    IF_UNAVAILABLE = "if_unavailable"
    WITHIN = "within"


class Step(msgspec.Struct, frozen=True):
    """One step: a model (`backend/model`), or `extractive` / `error` (the end)."""

    ref: str
    condition: Condition = Condition.ALWAYS
    # WITHIN: seconds after the request was accepted.
    within_s: float = 0.0

    @property
    def is_end(self) -> bool:
        return self.ref in ENDS

    def describe(self) -> str:
        if self.ref == EXTRACTIVE:
            return "extractive (the extractive answerer)"
        if self.ref == ERROR:
            return "error (BACKEND_UNAVAILABLE)"
        if self.condition is Condition.IF_UNAVAILABLE:
            return f"{self.ref} (only if every earlier model is down)"
        if self.condition is Condition.WITHIN:
            return f"{self.ref} (only within {self.within_s * 1000:g} ms of acceptance)"
        return self.ref


_WITHIN = re.compile(r"within=(\d+(?:\.\d+)?)(ms|s)")


def parse_step(text: str, *, default_backend: str = "") -> Step:
    """One written step (module doc); ChainError when it is not one."""
    text = text.strip()
    if text in ENDS:
        return Step(text)
    ref, _, cond = text.partition("@")
    ref = ref.strip()
    if not ref:
        raise ChainError(f"{text!r}: an empty model")
    if "/" not in ref:
        if not default_backend:
            raise ChainError(f"{text!r}: name the model as backend/model")
        ref = f"{default_backend}/{ref}"
    split_ref(ref)
    cond = cond.strip()
    if not cond:
        return Step(ref)
    if cond == Condition.IF_UNAVAILABLE:
        return Step(ref, Condition.IF_UNAVAILABLE)
    found = _WITHIN.fullmatch(cond)
    if found:
        value = float(found.group(1)) / (1000 if found.group(2) == "ms" else 1)
        if value <= 0:
            raise ChainError(f"{text!r}: within= takes a positive latency")
        return Step(ref, Condition.WITHIN, value)
    raise ChainError(f"{text!r}: the condition is @if_unavailable or @within=LATENCY "
                     "(e.g. @within=2s, @within=500ms)")


def check_chain(steps: list[str]) -> None:
    """A written chain as a policy stores it: steps that parse, ending in one end."""
    if not steps or any(not s.strip() for s in steps):
        raise ChainError("an empty step")
    if steps[-1].strip() not in ENDS:
        raise ChainError("the chain must end in 'extractive' or 'error'")
    if any(s.strip() in ENDS for s in steps[:-1]):
        raise ChainError("'extractive' / 'error' may only be the last step")
    for step in steps[:-1]:
        parse_step(step, default_backend="slot")


def chosen_model(asked: str, policy: AgentPolicy, slot_model: str) -> str:
    """The chain's first model: the one the caller asked for (`AgentRequest.model`) when
    the agent's policy lists it (`models=`), else the slot's ("" without a model server:
    the extractive answerer answers alone). The generator walks from it; the answer
    cache keys an answer by it (shared.cache.answerer)."""
    return asked if asked and slot_model and asked in policy.models else slot_model


def check_asked(asked: str, policy: AgentPolicy, *,
                served: Callable[[str], bool] | None = None) -> None:
    """The model a request names (`AgentRequest.model`, "" for none) is one its agent
    may choose (the policy's `models=`) and, given `served` (the fleet's `has`), one the
    fleet declares; else UnknownModelError, the one outcome at every door: the gateway
    and the OpenAI door check the policy before any work, the generator (which holds
    the fleet) both."""
    if not asked:
        return
    if asked not in policy.models:
        allowed = ", ".join(policy.models) or "none"
        raise UnknownModelError(f"model {asked!r} is not one this agent may choose "
                                f"(its policy's models=: {allowed})")
    if served is not None and not served(asked):
        raise UnknownModelError(f"model {asked!r} is not served by the model fleet")


def build_chain(slot_model: str, written: list[str] | None) -> list[Step]:
    """The steps a request of this slot walks: its model first (always), then the
    agent's chain (`written`, default: `extractive`), a model already named skipped.
    Without a slot model (no model server) the extractive answerer answers alone."""
    if not slot_model:
        return [Step(EXTRACTIVE)]
    backend = slot_model.partition("/")[0]
    steps = [Step(slot_model)]
    seen = {slot_model}
    for text in written or [EXTRACTIVE]:
        step = parse_step(text, default_backend=backend)
        if step.is_end:
            steps.append(step)
            break
        if step.ref not in seen:
            seen.add(step.ref)
            steps.append(step)
    if not steps[-1].is_end:
        steps.append(Step(EXTRACTIVE))
    return steps


def describe_chain(steps: list[Step], *, ttft_ms: float, stall_ms: float) -> list[str]:
    """The chain as it will be walked, one line a step (`agent show`)."""
    lines = [f"{n}. {step.describe()}" for n, step in enumerate(steps, 1)]
    lines.append(f"   each model: first token within {ttft_ms:g} ms, then no gap over "
                 f"{stall_ms:g} ms between tokens")
    return lines
