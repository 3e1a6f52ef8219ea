"""The chain of a model slot (ADR-0006), walked across the fleet, and the accounting of
each answer.

A request's answer is tried step by step (shared.llm.walk): the slot's model first,
then the steps of the agent's chain for that slot (`intentroute agent set NAME
fallback.main=cloud/big@if_unavailable,error`, shared.policy.chain), each model timed
on its first byte, its first token (the agent's `ttft_ms`) and its gaps (`stall_ms`),
each backend's circuit shared by every replica. A cut or stalled answer is continued by
the next model when it takes a prefill, else restarted cleanly; the chain ends in the
extractive answerer (the default) or an explicit error, as the agent prefers. Without a
model server the extractive answerer is the answer itself, not a fallback.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from opentelemetry.trace import Tracer

from services.generator.extractive import extractive_answer, with_why
from services.generator.health import FleetHealth
from services.generator.prompts import render_prompt
from shared.common.settings import CommonSettings
from shared.contracts.pipeline import Routed, Usage, UsagePart
from shared.llm.walk import Timing, Walked, Walker
from shared.policy.agent import AgentPolicy
from shared.policy.chain import EXTRACTIVE, Step, build_chain

Sink = Callable[[str], Awaitable[None]]


def steps_for(policy: AgentPolicy, slot: str, slot_model: str) -> list[Step]:
    """The steps a request of this agent walks on this slot, in order."""
    return build_chain(slot_model, policy.fallback.get(slot))


def timing_for(policy: AgentPolicy, common: CommonSettings) -> Timing:
    """The agent's latency targets, else the globals (LLM_*_MS)."""
    ttft = policy.ttft_ms if policy.ttft_ms is not None else common.llm_ttft_ms
    stall = policy.stall_ms if policy.stall_ms is not None else common.llm_stall_ms
    return Timing(first_byte=common.llm_first_byte_ms / 1000, ttft=ttft / 1000,
                  stall=stall / 1000)


@dataclass
class Answered:
    """How one generation went: who answered (`answered_by`: a `backend/model`,
    "extractive", or "" when the chain ended in an error: `error_code` and `error` say
    which and why), and what it took."""

    answered_by: str
    usage: Usage
    error: str = ""
    error_code: str = ""


def usage_of(walked: Walked) -> Usage:
    """The request log's accounting of a walk: the model that wrote the delivered answer,
    the tokens of every part of it (a continued answer has two or more, each billed at
    its own model's price), the time of every attempt, why it fell back."""
    parts = walked.parts
    usage = Usage(model=walked.answered_by if walked.answered_by else "")
    usage.compute_ms = sum(a.ms for a in walked.attempts) + sum(
        p.ms for p in parts if p.ref == EXTRACTIVE)
    if walked.answered_by == EXTRACTIVE:
        usage.tokens_note = EXTRACTIVE
    else:
        usage.tokens_in = sum(p.tokens_in for p in parts)
        usage.tokens_out = sum(p.tokens_out for p in parts)
        uncounted = [p for p in parts if not p.counted]
        if uncounted:
            backend = uncounted[0].ref.partition("/")[0]
            usage.tokens_note = (f"not reported by {backend}" if len(parts) == 1
                                 else f"a cut part counted by its pieces ({backend})")[:64]
    if len(parts) > 1:
        usage.parts = [UsagePart(p.ref, p.tokens_in, p.tokens_out) for p in parts]
    usage.fallback = walked.fell_back
    usage.fallback_reason = walked.reason()[:64]
    return usage


async def produce(
    walker: Walker,
    tracer: Tracer,
    steps: list[Step],
    env: Routed,
    *,
    previous_answer: str,
    sink: Sink,
    on_restart: Callable[[], Awaitable[None]],
    timing: Timing,
    health: FleetHealth | None = None,
) -> Answered:
    """Stream the answer of the first step that answers into `sink` (module doc)."""
    with tracer.start_as_current_span("generate.chain",
                                      attributes={"steps": [s.ref for s in steps]}):
        walked = await walker.stream_answer(
            steps, render_prompt(env, previous_answer=previous_answer), sink=sink,
            on_restart=on_restart, accepted_at=env.accepted_at, timing=timing,
            extractive=lambda why: with_why(
                extractive_answer(env, previous_answer=previous_answer), why))
    if health is not None:
        health.record(walked)
    return Answered(walked.answered_by, usage_of(walked), walked.error, walked.error_code)


def merged(before: Usage | None, now: Usage) -> Usage:
    """The accounting of a request generated twice (RC-08 retry): counts and time add
    up; the model is the one that wrote the delivered answer; a fallback in either
    attempt is a fallback of the request."""
    if before is None:
        return now
    return Usage(
        model=now.model,
        tokens_in=before.tokens_in + now.tokens_in,
        tokens_out=before.tokens_out + now.tokens_out,
        tokens_note=now.tokens_note or before.tokens_note,
        compute_ms=before.compute_ms + now.compute_ms,
        fallback=before.fallback or now.fallback,
        fallback_reason=before.fallback_reason or now.fallback_reason,
        parts=[*(before.parts or [UsagePart(before.model, before.tokens_in,
                                            before.tokens_out)]),
               *(now.parts or [UsagePart(now.model, now.tokens_in, now.tokens_out)])]
        if (before.parts or now.parts or before.model != now.model) else [],
    )
