"""Classifier subscriber: read the intent history, decide, record the turn, route."""

from __future__ import annotations

import asyncio
import time

from faststream import Context
from faststream.middlewares import AckPolicy
from faststream.nats import NatsBroker, NatsMessage, NatsRouter, PullSub

from services.classifier.cascade import Cascade
from services.classifier.settings import ClassifierSettings
from shared.bus import PIPELINE_STREAM, consumer_config, publish_stage
from shared.codec import encode
from shared.contracts.pipeline import CLASSIFY_SUBJECT, RETRIEVE_SUBJECT, generate_subject
from shared.contracts.routing import RETRIEVING_TYPES, topic_snippet
from shared.stage import decode_or_report, stage_guard
from shared.store.stores import HistoryRow, Store


class ClassifierDeps:
    def __init__(self, store: Store, cascade: Cascade) -> None:
        self.store = store
        self.cascade = cascade

    async def close(self) -> None:
        await self.store.close()


def build_router(settings: ClassifierSettings) -> NatsRouter:
    router = NatsRouter()

    @router.subscriber(
        CLASSIFY_SUBJECT,
        stream=PIPELINE_STREAM,
        durable="classifier",
        pull_sub=PullSub(batch_size=settings.batch_size, timeout=5.0),
        config=consumer_config(settings.common),
        ack_policy=AckPolicy.NACK_ON_ERROR,
    )
    async def on_classify(
        msg: NatsMessage,
        deps: ClassifierDeps = Context("deps"),
        broker: NatsBroker = Context("broker"),
    ) -> None:
        env = await decode_or_report(broker, msg, "classify")
        if env is None:
            return
        async with stage_guard(broker, msg, env, stage="classify",
                               max_deliver=settings.common.max_deliver, store=deps.store):
            started = time.perf_counter()
            req = env.request
            # RC-06: the classifier reads at most the last 6 entries.
            history = await deps.store.last_history(req.agent_id, req.session_id)
            decision = await deps.cascade.decide(req, history)
            env.decision = decision
            env.history = history
            env.timings["classify"] = round((time.perf_counter() - started) * 1000, 3)
            # RC-04: only RETRIEVAL and CODE_GENERATION go through the retriever.
            if decision.type in RETRIEVING_TYPES:
                subject = RETRIEVE_SUBJECT
            else:
                subject = generate_subject(decision.model_slot)
            row = HistoryRow(
                agent_id=req.agent_id,
                session_id=req.session_id,
                request_id=req.request_id,
                type=decision.type.value,
                topic=topic_snippet(req.query),
                layer=decision.layer.value,
                confidence=decision.confidence,
            )
            # The history write and the hand-off share the wait; ack comes after both.
            await asyncio.gather(
                deps.store.write(row),
                publish_stage(broker, subject, encode(env), msg_id=f"{req.request_id}:classified"),
            )

    return router
