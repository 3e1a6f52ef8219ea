"""Classifier subscriber: read the intent history, decide, record the turn, route."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from services.classifier.cascade import Cascade
from services.classifier.part_routing import route_parts
from services.classifier.rules import has_platform_prefix
from services.classifier.settings import ClassifierSettings
from shared.contracts import pipeline
from shared.contracts.codec import decode_admitted
from shared.contracts.pipeline import (
    CLASSIFY_SUBJECT,
    Admitted,
    PartPlan,
    Routed,
    first_subject,
)
from shared.contracts.request import AgentRequest
from shared.contracts.response import ChunkKind
from shared.contracts.routing import (
    Clarity,
    HistoryEntry,
    QueryType,
    RoutingDecision,
)
from shared.policy.agent import ClarityPolicy, MultiIntent
from shared.policy.ports import Policies
from shared.runtime.answer_stream import AnswerStream
from shared.runtime.endings import request_log_row
from shared.runtime.message_parts import open_part
from shared.runtime.stage import (
    Call,
    Handoff,
    Stage,
    StageDeps,
    history_row,
    payload,
    stage_spec,
)
from shared.store.ports import StoreReadTimeoutError

if TYPE_CHECKING:
    from services.classifier.answer_cache import ClassifierCache


@dataclass(kw_only=True)
class ClassifierDeps(StageDeps):
    cascade: Cascade
    policies: Policies
    # The agents' stored answers (services.classifier.answer_cache); None: Layer 2 off.
    answer_cache: ClassifierCache | None = None


# What the `ask` clarity policy asks back about: a decision below the agent's clarity
# threshold, or one carrying several requests. A decision between that threshold and
# the decide threshold (NEEDS_CONFIRMATION) goes on with the best guess; the decision it
# carries says so and lists the alternatives.
ASKED = frozenset({Clarity.NEEDS_CLARIFICATION, Clarity.MULTI_INTENT})


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


def build_stage(settings: ClassifierSettings) -> Stage[Admitted, ClassifierDeps]:
    async def on_classify(env: Admitted, call: Call, deps: ClassifierDeps) -> Handoff | None:
        req = env.request

        unread: list[bool] = []

        async def history() -> list[HistoryEntry]:
            # RC-06: the classifier reads at most the last 6 entries, and only when a
            # deictic message or Layer 3 needs them.
            try:
                return await deps.store.last_history(req.agent_id, req.session_id)
            except StoreReadTimeoutError:
                # Postgres away (issue 32): decided as a session's first turn is, which
                # RC-01..RC-06 allow (the history never predicts a type: RC-03), marked.
                unread.append(True)
                return []

        # The agent's policy (ADR-0006) overrides the global clarity threshold and policy.
        policy = deps.policies.policy_for(req.agent_id, req.request_id)
        multi = policy.multi_intent or settings.multi_intent

        async def split_up() -> Handoff | None:
            plans = await route_parts(deps.cascade, req, history, trusted=env.trusted,
                                      confirm=policy.clarity_threshold)
            if not plans:
                return None
            if unread:
                plans = [msgspec.structs.replace(p, decision=unread_marked(p.decision))
                         for p in plans]
            routed = split_routed(env, plans, first_only=multi is MultiIntent.FIRST)
            await open_part(deps.bus, routed, redelivered=call.delivery.deliveries > 1)
            return Handoff(first_subject(routed.decision), routed, "classified")

        # Split and answered part by part, a message is never decided whole: its parts
        # are routed first (the first part starts one decision sooner). Under `ask` the
        # whole message's decision comes first: its clarity gate may ask instead.
        if multi is not MultiIntent.ASK and may_split(req, trusted=env.trusted):
            handoff = await split_up()
            if handoff is not None:
                return handoff
        decision = await deps.cascade.decide(req, history, trusted=env.trusted,
                                             confirm=policy.clarity_threshold)
        if unread:
            decision = unread_marked(decision)
        routed = Routed.from_admitted(env, decision)
        ask = (policy.clarity_policy or settings.clarity_policy) == ClarityPolicy.ASK
        if multi is MultiIntent.ASK:
            # Today's behaviour (issue 34): never cut; asked when the gate sees several.
            ask = ask or decision.clarity == Clarity.MULTI_INTENT
        if ask and decision.clarity in ASKED:
            call.mark(routed)
            await ask_back(deps, routed)
            return None
        # Issue 33: an answer the agent got before may answer it, skipping the rest.
        if deps.answer_cache is not None and await deps.answer_cache.serve(routed, call, deps):
            return None
        # RC-04: only RETRIEVAL and CODE_GENERATION go through the retriever.
        # This turn's classify_history row travels in the envelope's decision and is
        # written with the turn by the stage that ends it (shared.runtime.stage.finish_turn).
        return Handoff(first_subject(decision), routed, "classified")

    return Stage(
        name="classify",
        spec=stage_spec(
            settings.common,
            stream=pipeline.STREAM,
            subject=CLASSIFY_SUBJECT,
            durable="classifier",
            max_inflight=settings.batch_size,
        ),
        decode=payload(decode_admitted),
        logic=on_classify,
    )


def unread_marked(decision: RoutingDecision) -> RoutingDecision:
    """A decision made without the intent history, which could not be read."""
    return msgspec.structs.replace(decision, history_unavailable=True)


def may_split(req: AgentRequest, *, trusted: bool) -> bool:
    """A declared type (a trusted caller's: the cascade's DECLARED layer) and the RC-01
    platform prefix decide the whole message: it is never cut."""
    if trusted and req.query_type:
        return False
    return not (trusted and has_platform_prefix(req.query))


def split_routed(env: Admitted, plans: list[PartPlan], *, first_only: bool) -> Routed:
    """The envelope of a split message, its first part's turn (`first_only`: that part
    alone, as a message of one request)."""
    first = plans[0]
    request = msgspec.structs.replace(env.request, query=first.text)
    routed = Routed.from_admitted(msgspec.structs.replace(env, request=request),
                                  first.decision)
    if not first_only:
        routed.parts = plans
        routed.message = env.request.query
    return routed


async def ask_back(deps: StageDeps, env: Routed) -> None:
    """Clarity policy `ask`: a clarification chunk with the options; nothing generated."""
    await deps.store.write(history_row(env), request_log_row(env, "clarification"))
    await AnswerStream(deps.bus, env.request.agent_id, env.request.request_id,
                       start_seq=env.seq).final(
        decision=env.decision, text=clarification_text(env.decision),
        kind=ChunkKind.CLARIFICATION,
    )
