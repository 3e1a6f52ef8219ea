"""Classifier subscriber: read the intent history, decide, record the turn, route."""

from __future__ import annotations

import time

from services.classifier.cascade import Cascade
from services.classifier.settings import ClassifierSettings
from shared.bus import AnswerStream, Bus, publish_stage
from shared.codec import encode
from shared.consumer import Delivery, Stage
from shared.contracts import pipeline
from shared.contracts.pipeline import CLASSIFY_SUBJECT, RETRIEVE_SUBJECT, Envelope, generate_subject
from shared.contracts.response import ChunkKind
from shared.contracts.routing import (
    RETRIEVING_TYPES,
    Clarity,
    HistoryEntry,
    QueryType,
    RoutingDecision,
)
from shared.runtime import Closable
from shared.stage import decode_or_report, history_row, request_log_row, stage_guard, stage_spec
from shared.store.stores import Store


class ClassifierDeps:
    def __init__(
        self, bus: Bus, store: Store, cascade: Cascade, layer2: Closable | None = None
    ) -> None:
        self.bus = bus
        self.store = store
        self.cascade = cascade
        self.layer2 = layer2

    async def close(self) -> None:
        if self.layer2 is not None:
            await self.layer2.close()
        await self.store.close()


_WHAT = {
    QueryType.RETRIEVAL: "an explanation from the AVAP documentation",
    QueryType.CODE_GENERATION: "AVAP code written for you",
    QueryType.CONVERSATIONAL: "my previous answer rephrased",
    QueryType.PLATFORM: "information about your account, usage or billing",
}


def clarification_text(decision: RoutingDecision) -> str:
    """The question asked instead of answering, under the `ask` clarity policy."""
    options = [decision.type] + [a.type for a in decision.alternatives if a.type != decision.type]
    listed = "; ".join(f"({i}) {_WHAT[t]} [{t.value}]" for i, t in enumerate(options[:3], 1))
    if decision.clarity == Clarity.MULTI_INTENT:
        return f"Your message asks for more than one thing: {listed}. Please send them one by one."
    if decision.clarity == Clarity.NEEDS_CONFIRMATION:
        best = f"{_WHAT[decision.type]} [{decision.type.value}]"
        return f"Do you want {best}? Other options: {listed}."
    return f"I am not sure what you need. Do you want {listed}?"


def build_stage(settings: ClassifierSettings) -> Stage[ClassifierDeps]:
    async def on_classify(msg: Delivery, deps: ClassifierDeps) -> None:
        bus = deps.bus
        env = await decode_or_report(bus, msg, "classify")
        if env is None:
            return
        async with stage_guard(bus, msg, env, stage="classify",
                               max_deliver=settings.common.max_deliver, store=deps.store):
            started = time.perf_counter()
            req = env.request

            async def history() -> list[HistoryEntry]:
                # RC-06: the classifier reads at most the last 6 entries, and only when a
                # deictic message or Layer 3 needs them.
                return await deps.store.last_history(req.agent_id, req.session_id)

            decision = await deps.cascade.decide(req, history)
            env.decision = decision
            if decision.clarity != Clarity.CLEAR and settings.policy_for(req.agent_id) == "ask":
                await _ask_back(bus, deps.store, env, decision, started)
                return
            env.timings["classify"] = round((time.perf_counter() - started) * 1000, 3)
            # RC-04: only RETRIEVAL and CODE_GENERATION go through the retriever.
            if decision.type in RETRIEVING_TYPES:
                subject = RETRIEVE_SUBJECT
            else:
                subject = generate_subject(decision.model_slot)
            # This turn's classify_history row travels in the envelope's decision and is
            # written with the turn by the stage that ends it (shared.stage.finish_turn).
            await publish_stage(bus, subject, encode(env), msg_id=f"{req.request_id}:classified")

    return Stage(
        stage_spec(
            settings.common,
            stream=pipeline.STREAM,
            subject=CLASSIFY_SUBJECT,
            durable="classifier",
            max_inflight=settings.batch_size,
        ),
        on_classify,
    )


async def _ask_back(
    bus: Bus, store: Store, env: Envelope, decision: RoutingDecision, started: float
) -> None:
    """Clarity policy `ask`: a clarification chunk with the options; nothing generated."""
    req = env.request
    env.timings["classify"] = round((time.perf_counter() - started) * 1000, 3)
    await store.write(history_row(env), request_log_row(env, "clarification"))
    await AnswerStream(bus, req.request_id, start_seq=env.seq).final(
        decision=decision, text=clarification_text(decision), kind=ChunkKind.CLARIFICATION
    )
