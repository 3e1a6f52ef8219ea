"""Retriever subscriber: passages for RETRIEVAL / CODE_GENERATION, then the main slot."""

from __future__ import annotations

import time

from services.retriever.adapters import RelevanceJudge
from services.retriever.logic import RelevancePolicy, retrieve
from services.retriever.port import Retrieval
from services.retriever.settings import RetrieverSettings
from shared.bus import Bus, publish_stage
from shared.codec import encode
from shared.consumer import Delivery, Stage
from shared.contracts import pipeline
from shared.contracts.pipeline import RETRIEVE_SUBJECT, generate_subject
from shared.contracts.routing import RETRIEVING_TYPES
from shared.stage import PermanentError, decode_or_report, stage_guard, stage_spec
from shared.store.stores import Store


class RetrieverDeps:
    def __init__(self, bus: Bus, store: Store, retrieval: Retrieval, *,
                 judge: RelevanceJudge | None = None) -> None:
        self.bus = bus
        self.store = store
        self.retrieval = retrieval
        self.judge = judge

    async def close(self) -> None:
        await self.retrieval.close()
        await self.store.close()


def build_stage(settings: RetrieverSettings) -> Stage[RetrieverDeps]:
    policy = RelevancePolicy(mode=settings.relevance_mode, signal=settings.relevance_signal,
                             threshold=settings.relevance_threshold,
                             strategy=settings.retry_strategy)

    async def on_retrieve(msg: Delivery, deps: RetrieverDeps) -> None:
        bus = deps.bus
        env = await decode_or_report(bus, msg, "retrieve")
        if env is None:
            return
        async with stage_guard(bus, msg, env, stage="retrieve",
                               max_deliver=settings.common.max_deliver, store=deps.store):
            started = time.perf_counter()
            decision = env.decision
            # RC-04 guard: a PLATFORM/CONVERSATIONAL envelope here is a routing bug.
            if decision is None or decision.type not in RETRIEVING_TYPES:
                raise PermanentError(
                    "RC04_VIOLATION",
                    f"{decision.type if decision else 'unclassified'} request reached the "
                    "retriever",
                )
            await deps.retrieval.maybe_reload()
            req = env.request

            async def last_turns() -> list[str]:
                turns = await deps.store.last_turns(req.agent_id, req.session_id, 6)
                return [content for role, content in turns if role == "user"]

            got = await retrieve(req.query, decision.type, deps.retrieval, k=settings.top_k,
                                 policy=policy, last_turns=last_turns, judge=deps.judge)
            env.passages = got.passages
            env.retrieval_query = got.query
            env.retrieval_retried = got.retried
            env.timings["retrieve"] = round((time.perf_counter() - started) * 1000, 3)
            await publish_stage(
                bus, generate_subject(decision.model_slot), encode(env),
                msg_id=f"{env.request.request_id}:retrieved",
            )

    return Stage(
        stage_spec(
            settings.common,
            stream=pipeline.STREAM,
            subject=RETRIEVE_SUBJECT,
            durable="retriever",
            max_inflight=settings.batch_size,
        ),
        on_retrieve,
    )
