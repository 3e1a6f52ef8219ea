"""Generator subscriber (one per model slot): prompt, stream, finish or hand to the validator."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from services.generator.backends import BackendUnavailableError, ChatBackend
from services.generator.extractive import extractive_answer
from services.generator.prompts import render_prompt
from services.generator.settings import GeneratorSettings
from shared.bus import AnswerStream
from shared.codec import decode_routed
from shared.contracts import pipeline, response
from shared.contracts.pipeline import VALIDATE_SUBJECT, Routed, generate_subject
from shared.contracts.response import response_subject
from shared.contracts.routing import QueryType
from shared.stage import Call, Handoff, Stage, StageDeps, finish_turn, payload, stage_spec

log = logging.getLogger("intentroute.generator")

Sink = Callable[[str], Awaitable[None]]


@dataclass(kw_only=True)
class GeneratorDeps(StageDeps):
    backend: ChatBackend | None
    model: str


async def produce(
    deps: GeneratorDeps,
    env: Routed,
    *,
    previous_answer: str,
    sink: Sink,
    on_restart: Callable[[], Awaitable[None]],
    timeout: float,
) -> str:
    """Stream the answer into `sink`; fall back to the extractive answerer when the
    model server fails or takes longer than `timeout` (its own, or what is left of the
    request's deadline). Returns `answered_by`. (The consumer keeps the message alive
    while a long answer streams.)"""
    if deps.backend is not None and deps.model:
        sent = False
        try:
            messages = render_prompt(env, previous_answer=previous_answer)
            with deps.tracer.start_as_current_span(
                f"{deps.backend.name}.chat", attributes={"model": deps.model}
            ):
                async with asyncio.timeout(timeout):
                    async for token in deps.backend.stream(deps.model, messages):
                        await sink(token)
                        sent = True
            return f"{deps.backend.name}:{deps.model}"
        except (BackendUnavailableError, TimeoutError) as exc:
            log.warning("[generate] %s unavailable, answering extractively: %r",
                        deps.backend.name, exc)
            if sent:
                await on_restart()
    await sink(extractive_answer(env, previous_answer=previous_answer))
    return "extractive"


def build_stage(settings: GeneratorSettings) -> Stage[Routed, GeneratorDeps]:
    slot = settings.slot.value

    async def on_generate(env: Routed, call: Call, deps: GeneratorDeps) -> Handoff | None:
        return await generate(settings, deps, call, env)

    return Stage(
        name=f"generate.{slot}",
        spec=stage_spec(
            settings.common,
            stream=pipeline.STREAM,
            subject=generate_subject(settings.slot),
            durable=f"generator-{slot}",
            max_inflight=settings.concurrency,
        ),
        decode=payload(decode_routed),
        logic=on_generate,
    )


async def generate(
    settings: GeneratorSettings, deps: GeneratorDeps, call: Call, env: Routed
) -> Handoff | None:
    req, decision = env.request, env.decision
    previous = ""
    if decision.type == QueryType.CONVERSATIONAL:
        previous = await deps.store.previous_answer(req.agent_id, req.session_id) or ""
    timeout = call.remaining(settings.ollama_timeout)

    if decision.type == QueryType.CODE_GENERATION:
        # RC-07: code is not delivered before validation; collect it for the validator.
        parts: list[str] = []

        async def collect(token: str) -> None:
            parts.append(token)

        async def restart() -> None:
            parts.clear()

        env.answered_by = await produce(deps, env, previous_answer=previous, sink=collect,
                                        on_restart=restart, timeout=timeout)
        env.answer = "".join(parts)
        return Handoff(VALIDATE_SUBJECT, env, f"generated:{env.attempt}")

    start_seq = env.seq
    redelivered = call.delivery.deliveries > 1
    if redelivered:
        last = await deps.bus.last_chunk(response_subject(req.agent_id, req.request_id),
                                         response.STREAM)
        start_seq = max(start_seq, last.seq + 1 if last else 0)
    out = AnswerStream(deps.bus, req.agent_id, req.request_id, start_seq=start_seq)
    if redelivered and start_seq > env.seq:
        await out.reset()
    answered_by = await produce(deps, env, previous_answer=previous, sink=out.text,
                                on_restart=out.reset, timeout=timeout)
    call.mark(env)
    await finish_turn(deps.store, env, answer=out.answer, answered_by=answered_by)
    await out.final(decision=decision, answered_by=answered_by,
                    retried=env.retrieval_retried)
    return None
