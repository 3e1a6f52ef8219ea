"""Generator subscriber (one per model slot): prompt, stream, finish or hand to the validator."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec

from services.generator.fallback import Answered, Sink, merged, steps_for, timing_for
from services.generator.fallback import produce as produce_answer
from services.generator.health import FleetHealth
from services.generator.settings import GeneratorSettings
from shared.cache.offer import CacheWriter
from shared.contracts import pipeline
from shared.contracts.codec import decode_routed
from shared.contracts.pipeline import VALIDATE_SUBJECT, PartDone, Routed, generate_subject
from shared.contracts.response import ErrorCode
from shared.contracts.routing import QueryType
from shared.llm.walk import Walker
from shared.policy.chain import EXTRACTIVE, Step, check_asked, chosen_model
from shared.policy.ports import Policies
from shared.runtime.answer_stream import AnswerStream
from shared.runtime.endings import answer_usage
from shared.runtime.message_parts import end_part, open_part, previous_part_answer
from shared.runtime.stage import (
    Call,
    Handoff,
    PermanentError,
    Stage,
    StageDeps,
    finish_turn,
    payload,
    stage_spec,
)
from shared.store.ports import StoreReadTimeoutError

# `answered_by` of a request the gateway degraded (the agent is past its budget and its
# policy says on_budget=degrade): the extractive answer, no model asked.
DEGRADED_BY = f"{EXTRACTIVE}:budget"


@dataclass(kw_only=True)
class GeneratorDeps(StageDeps):
    # The fleet's clients, declarations and shared circuits (shared.llm.walk).
    walker: Walker
    # The slot's model (`backend/model`, "" without a model server): every chain's first.
    model: str
    policies: Policies
    # The models' last outcomes, reported on the services API (`intentroute status`).
    health: FleetHealth | None = None
    # Stores the answers the cache may keep (shared.cache.offer; main slot only).
    answer_cache: CacheWriter | None = None


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
    policy = deps.policies.policy_for(req.agent_id, req.request_id)
    if not env.degraded:
        # A model the request names: one its agent may choose, and one of the fleet.
        check_asked(req.model, policy, served=deps.walker.fleet.has)
    # A split message's part opens here when generation is its first stage.
    await open_part(deps.bus, env, redelivered=call.delivery.deliveries > 1)
    previous = ""
    if decision.type == QueryType.CONVERSATIONAL:
        previous = await previous_answer(deps, env)
        decision = env.decision
    steps = ([Step(EXTRACTIVE)] if env.degraded else
             steps_for(policy, settings.slot.value, chosen_model(req.model, policy,
                                                                 deps.model)))
    timing = timing_for(policy, settings.common)

    async def produce(sink: Sink, on_restart: Callable[[], Awaitable[None]]) -> Answered:
        answered = await produce_answer(
            deps.walker, deps.tracer, steps, env, previous_answer=previous, sink=sink,
            on_restart=on_restart, timing=timing, health=deps.health)
        if settings.common.accounting:
            env.usage = merged(env.usage, answered.usage)
        if env.degraded:
            answered.answered_by = DEGRADED_BY
        return answered

    if decision.type == QueryType.CODE_GENERATION:
        # RC-07: code is not delivered before validation; collect it for the validator.
        parts: list[str] = []

        async def collect(token: str) -> None:
            parts.append(token)

        async def restart() -> None:
            parts.clear()

        answered = await produce(collect, restart)
        if answered.error:
            raise PermanentError(answered.error,
                                 code=answered.error_code or ErrorCode.BACKEND_UNAVAILABLE)
        env.answered_by = answered.answered_by
        env.answer = "".join(parts)
        return Handoff(VALIDATE_SUBJECT, env, f"generated:{env.attempt}")

    out = await AnswerStream.resume(deps.bus, req.agent_id, req.request_id, start_seq=env.seq,
                                    redelivered=call.delivery.deliveries > 1)
    answered = await produce(out.text, out.reset)
    call.mark(env)
    if answered.error:
        # The answer so far (if any) was reset; the error follows it on the subject.
        env.seq = out.seq
        raise PermanentError(answered.error,
                             code=answered.error_code or ErrorCode.BACKEND_UNAVAILABLE)
    if env.parts:
        return await end_part(deps, out, env, PartDone(
            answer=out.answer, answered_by=answered.answered_by, usage=env.usage))
    await finish_turn(deps.store, env, answer=out.answer, answered_by=answered.answered_by,
                      first_chunk_at=out.first_text_at)
    await out.final(decision=decision, answered_by=answered.answered_by,
                    retried=env.retrieval_retried, usage=answer_usage(env))
    if deps.answer_cache is not None:
        deps.answer_cache.offer(env, answer=out.answer, answered_by=answered.answered_by)
    return None


async def previous_answer(deps: StageDeps, env: Routed) -> str:
    """What a CONVERSATIONAL turn rephrases: a part the part before it, a message the
    session's last answer (from its queued rows while they wait for Postgres)."""
    previous = previous_part_answer(env)
    if previous:
        return previous
    req = env.request
    try:
        return await deps.store.previous_answer(req.agent_id, req.session_id) or ""
    except StoreReadTimeoutError:
        # Postgres away and nothing of the session queued (issue 32): answered as a
        # session's first turn is, and the decision says so.
        env.decision = msgspec.structs.replace(env.decision, history_unavailable=True)
        return ""
