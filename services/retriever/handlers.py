"""Retriever subscriber: passages for RETRIEVAL / CODE_GENERATION, then the main slot."""

from __future__ import annotations

from dataclasses import dataclass

from services.retriever.logic import RelevancePolicy, retrieve, with_editor_commands
from services.retriever.ports import RelevanceJudge, Retrieval
from services.retriever.settings import RetrieverSettings
from shared.contracts import pipeline
from shared.contracts.codec import decode_routed
from shared.contracts.pipeline import RETRIEVE_SUBJECT, Routed, generate_subject
from shared.contracts.response import ErrorCode
from shared.contracts.routing import RETRIEVING_TYPES
from shared.runtime.message_parts import open_part
from shared.runtime.stage import (
    Call,
    Handoff,
    PermanentError,
    Stage,
    StageDeps,
    payload,
    stage_spec,
)
from shared.store.ports import StoreReadTimeoutError


@dataclass(kw_only=True)
class RetrieverDeps(StageDeps):
    retrieval: Retrieval
    judge: RelevanceJudge | None = None


def build_stage(settings: RetrieverSettings) -> Stage[Routed, RetrieverDeps]:
    policy = RelevancePolicy(mode=settings.relevance_mode, signal=settings.relevance_signal,
                             threshold=settings.relevance_threshold,
                             strategy=settings.retry_strategy)

    async def on_retrieve(env: Routed, call: Call, deps: RetrieverDeps) -> Handoff:
        decision = env.decision
        # RC-04 guard: a PLATFORM/CONVERSATIONAL envelope here is a routing bug.
        if decision.type not in RETRIEVING_TYPES:
            raise PermanentError(f"{decision.type} request reached the retriever",
                                 code=ErrorCode.RC04_VIOLATION)
        # A split message's part opens here when retrieval is its first stage.
        await open_part(deps.bus, env, redelivered=call.delivery.deliveries > 1)
        await deps.retrieval.maybe_reload()
        req = env.request

        async def last_turns() -> list[str]:
            try:
                turns = await deps.store.last_turns(req.agent_id, req.session_id, 6)
            except StoreReadTimeoutError:  # Postgres away (issue 32): no rewrite
                return []
            return [content for role, content in turns if role == "user"]

        query = req.query
        if decision.resolved_reference and req.editor_context:
            # RC-03: the pointer resolved to the editor; search for what it holds.
            query = with_editor_commands(query, req.editor_context)
        got = await retrieve(query, decision.type, deps.retrieval, k=settings.top_k,
                             policy=policy, last_turns=last_turns, judge=deps.judge)
        env.passages = got.passages
        env.retrieval_query = got.query
        env.retrieval_retried = got.retried
        return Handoff(generate_subject(decision.model_slot), env, "retrieved")

    return Stage(
        name="retrieve",
        spec=stage_spec(
            settings.common,
            stream=pipeline.STREAM,
            subject=RETRIEVE_SUBJECT,
            durable="retriever",
            max_inflight=settings.batch_size,
        ),
        decode=payload(decode_routed),
        logic=on_retrieve,
    )
