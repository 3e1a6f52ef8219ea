"""Generator subscriber (one per model slot): prompt, stream, finish or hand to the validator."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from opentelemetry.trace import Tracer

from services.generator.backends import BackendUnavailable, ChatBackend
from services.generator.extractive import extractive_answer
from services.generator.prompts import render_prompt
from services.generator.settings import GeneratorSettings
from shared.bus import AnswerStream, Bus, last_seq, publish_stage
from shared.codec import encode
from shared.consumer import Delivery, Stage
from shared.contracts import pipeline
from shared.contracts.pipeline import VALIDATE_SUBJECT, Envelope, generate_subject
from shared.contracts.routing import QueryType
from shared.stage import PermanentError, decode_or_report, finish_turn, stage_guard, stage_spec
from shared.store.stores import Store

log = logging.getLogger("intentroute.generator")

Sink = Callable[[str], Awaitable[None]]


class GeneratorDeps:
    def __init__(
        self, bus: Bus, store: Store, backend: ChatBackend | None, model: str, tracer: Tracer
    ) -> None:
        self.bus = bus
        self.store = store
        self.backend = backend
        self.model = model
        self.tracer = tracer

    async def close(self) -> None:
        await self.store.close()


async def produce(
    deps: GeneratorDeps,
    env: Envelope,
    *,
    previous_answer: str,
    sink: Sink,
    on_restart: Callable[[], Awaitable[None]],
    keepalive: Callable[[], Awaitable[None]],
) -> str:
    """Stream the answer into `sink`; fall back to the extractive answerer. Returns
    `answered_by`."""
    if deps.backend is not None and deps.model:
        sent = False
        try:
            messages = render_prompt(env, previous_answer=previous_answer)
            with deps.tracer.start_as_current_span(
                f"{deps.backend.name}.chat", attributes={"model": deps.model}
            ):
                async for token in deps.backend.stream(deps.model, messages):
                    await sink(token)
                    sent = True
                    await keepalive()
            return f"{deps.backend.name}:{deps.model}"
        except BackendUnavailable as exc:
            log.warning("[generate] %s unavailable, answering extractively: %s",
                        deps.backend.name, exc)
            if sent:
                await on_restart()
    await sink(extractive_answer(env, previous_answer=previous_answer))
    return "extractive"


def build_stage(settings: GeneratorSettings) -> Stage[GeneratorDeps]:
    slot = settings.slot.value

    async def on_generate(msg: Delivery, deps: GeneratorDeps) -> None:
        env = await decode_or_report(deps.bus, msg, f"generate.{slot}")
        if env is None:
            return
        async with stage_guard(deps.bus, msg, env, stage=f"generate.{slot}",
                               max_deliver=settings.common.max_deliver, store=deps.store):
            await _generate(settings, deps, msg, env)

    return Stage(
        stage_spec(
            settings.common,
            stream=pipeline.STREAM,
            subject=generate_subject(settings.slot),
            durable=f"generator-{slot}",
            max_inflight=settings.concurrency,
        ),
        on_generate,
    )


async def _generate(
    settings: GeneratorSettings,
    deps: GeneratorDeps,
    msg: Delivery,
    env: Envelope,
) -> None:
    bus = deps.bus
    started = time.perf_counter()
    req = env.request
    decision = env.decision
    if decision is None:
        raise PermanentError("NO_DECISION", "envelope reached the generator unclassified")
    previous = ""
    if decision.type == QueryType.CONVERSATIONAL:
        previous = await deps.store.previous_answer(req.agent_id, req.session_id) or ""

    last_keepalive = time.monotonic()

    async def keepalive() -> None:
        # Long answers: tell JetStream we are alive so it does not redeliver mid-stream.
        nonlocal last_keepalive
        if time.monotonic() - last_keepalive > settings.common.ack_wait / 3:
            await msg.in_progress()
            last_keepalive = time.monotonic()

    if decision.type == QueryType.CODE_GENERATION:
        # RC-07: code is not delivered before validation; collect it for the validator.
        parts: list[str] = []

        async def collect(token: str) -> None:
            parts.append(token)

        async def restart() -> None:
            parts.clear()

        env.answered_by = await produce(deps, env, previous_answer=previous, sink=collect,
                                        on_restart=restart, keepalive=keepalive)
        env.answer = "".join(parts)
        env.timings[f"generate.{settings.slot.value}"] = _ms(started)
        await publish_stage(bus, VALIDATE_SUBJECT, encode(env),
                            msg_id=f"{req.request_id}:generated:{env.attempt}")
        return

    start_seq = env.seq
    redelivered = msg.deliveries > 1
    if redelivered:
        start_seq = max(start_seq, await last_seq(bus, req.request_id))
    out = AnswerStream(bus, req.request_id, start_seq=start_seq)
    if redelivered and start_seq > env.seq:
        await out.reset()
    answered_by = await produce(deps, env, previous_answer=previous, sink=out.text,
                                on_restart=out.reset, keepalive=keepalive)
    env.timings[f"generate.{settings.slot.value}"] = _ms(started)
    await finish_turn(deps.store, env, answer=out.answer, answered_by=answered_by)
    await out.final(decision=decision, answered_by=answered_by,
                    retried=env.retrieval_retried)


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)
