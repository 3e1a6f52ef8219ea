"""The fallback chain of a model slot (ADR-0006) and the accounting of each answer.

A request's answer is tried step by step: the slot's model first, then the steps of
the agent's chain for that slot (`intentroute agent set NAME fallback.main=m1,m2,error`),
models already tried being skipped. A model step that fails (the server unreachable or
refusing, or too slow for the request's deadline) passes to the next one; the chain
ends in the extractive answerer (the default chain: `extractive`) or in an explicit
error (`error`), as the agent prefers. Without a model server the extractive answerer
is the answer itself, not a fallback, and no chain applies.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from opentelemetry.trace import Tracer

from services.generator.extractive import extractive_answer
from services.generator.health import BackendHealth
from services.generator.ports import BackendUnavailableError, ChatBackend, TokenCounts
from services.generator.prompts import render_prompt
from shared.common.deadline import time_left
from shared.contracts.pipeline import Routed, Usage
from shared.policy.agent import AgentPolicy, FallbackEnd

log = logging.getLogger("intentroute.generator")

Sink = Callable[[str], Awaitable[None]]
EXTRACTIVE = FallbackEnd.EXTRACTIVE.value
ERROR = FallbackEnd.ERROR.value
DEFAULT_CHAIN = [EXTRACTIVE]


def steps_for(policy: AgentPolicy, slot: str, model: str, *, backend: bool) -> list[str]:
    """The steps a request of this agent may take on this slot, in order."""
    if not (backend and model):
        return [EXTRACTIVE]
    steps = [model]
    for step in policy.fallback.get(slot) or DEFAULT_CHAIN:
        if step not in steps:
            steps.append(step)
    return steps


@dataclass
class Answered:
    """How one generation went: who answered (`answered_by`: "<backend>:<model>",
    "extractive", or "" when the chain ended in an error, `error` saying why), and what
    it took."""

    answered_by: str
    usage: Usage
    error: str = ""


def _note(counts: TokenCounts | None, backend: str) -> str:
    if counts is None:
        return f"not reported by {backend}"
    if counts.prompt is None or counts.completion is None:
        missing = "prompt_eval_count" if counts.prompt is None else "eval_count"
        return f"{missing} not reported"
    return ""


async def produce(
    backend: ChatBackend | None,
    tracer: Tracer,
    steps: list[str],
    env: Routed,
    *,
    previous_answer: str,
    sink: Sink,
    on_restart: Callable[[], Awaitable[None]],
    timeout: float,
    health: BackendHealth | None = None,
) -> Answered:
    """Stream the answer of the first step that succeeds into `sink`. A model step gets
    `timeout` seconds, or what is left of the request's deadline; one that fails after
    streaming part of its answer restarts it (`on_restart`) for the next step. Each model
    step's outcome goes to `health` (what `intentroute status` shows of the backend)."""
    usage = Usage()
    failures: list[str] = []

    def failed_over() -> None:
        usage.fallback = bool(failures)
        if failures:
            extra = f" +{len(failures) - 1}" if len(failures) > 1 else ""
            usage.fallback_reason = (failures[0] + extra)[:64]

    for step in steps:
        started = time.perf_counter()
        if step == EXTRACTIVE:
            await sink(extractive_answer(env, previous_answer=previous_answer))
            usage.compute_ms += (time.perf_counter() - started) * 1000
            usage.model, usage.tokens_note = EXTRACTIVE, "extractive"
            failed_over()
            return Answered(EXTRACTIVE, usage)
        if step == ERROR or backend is None:
            break
        sent = False
        counts: TokenCounts | None = None
        try:
            messages = render_prompt(env, previous_answer=previous_answer)
            with tracer.start_as_current_span(f"{backend.name}.chat", attributes={"model": step}):
                async with asyncio.timeout(time_left(timeout)):
                    async for part in backend.stream(step, messages):
                        if isinstance(part, TokenCounts):
                            counts = part
                            continue
                        await sink(part)
                        sent = True
        except (BackendUnavailableError, TimeoutError) as exc:
            usage.compute_ms += (time.perf_counter() - started) * 1000
            kind = "timeout" if isinstance(exc, TimeoutError) else "unavailable"
            failures.append(f"{kind} {step}")
            if health is not None:
                health.failed(step, str(exc) or "no answer before the deadline")
            log.warning("[generate] %s %s %s, next step: %r", backend.name, step, kind, exc)
            if sent:
                await on_restart()
            continue
        usage.compute_ms += (time.perf_counter() - started) * 1000
        if health is not None:
            health.ok(step)
        usage.model = step
        usage.tokens_in = (counts.prompt or 0) if counts else 0
        usage.tokens_out = (counts.completion or 0) if counts else 0
        usage.tokens_note = _note(counts, backend.name)
        failed_over()
        return Answered(f"{backend.name}:{step}", usage)
    failed_over()
    usage.fallback = True
    tried = "; ".join(failures) or "no model step"
    return Answered("", usage, error=f"no model answered ({tried}) and the agent's "
                                     "fallback chain ends in an error")


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
    )
