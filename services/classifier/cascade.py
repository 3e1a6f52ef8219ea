"""The classifier cascade: pure decision logic over injected layers.

1. caller-declared type (trusted agents only)                       layer `declared`
2. Layer 1 rule families (layer1.py): RC-01 platform prefix (trusted
   agents only), RC-02 platform data, code requests, social messages,
   reshape requests, deictic references resolved from history /
   editor (RC-03 scope). A final family decides at 1.0             layer `rules`
3. Layer 2 embedding head: decides at or above the threshold. A
   non-final family's decision is a prior on its prediction          layer `embedding`
   (the rule's type winning confidently stays                        layer `rules`);
   a deictic resolution meets the gate at its calibrated confidence  layer `rules`
4. Layer 3 LLM with the compact intent history                        layer `llm`
   (no LLM, or it does not answer: Layer 2's best guess)              layer `fallback`

Every decision carries the ADR-018 clarity outcome and its alternatives. Only a
deictic message ever looks at the history; the history never predicts a type.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable

import msgspec

from services.classifier.layer1 import (
    Family,
    RuleHit,
    match_contract,
    match_message,
    match_reference,
    points_elsewhere,
    with_account_figures,
)
from services.classifier.ports import Layer2, LlmLabeler, Prediction
from services.classifier.rules import (
    has_account_context,
    has_platform_data,
    has_platform_prefix,
    strip_platform_prefix,
)
from shared.contracts.request import AgentRequest
from shared.contracts.routing import (
    Alternative,
    Clarity,
    HistoryEntry,
    Layer,
    QueryType,
    RoutingDecision,
    slot_for,
)
from shared.policy.clarity import CONFIRM_THRESHOLD, DECIDE_THRESHOLD, clarity

log = logging.getLogger("intentroute.classifier")

# Joins that may put two requests in one message ("explain X and also show my usage").
_SPLIT = re.compile(
    r"\s*(?:[;?]|\.\s|,?\s+(?:and also|and then|also|plus|then|además|y también|y luego|"
    r"y después|luego|y además|and))\s+",
    re.IGNORECASE,
)


HistoryLoader = Callable[[], Awaitable[list[HistoryEntry]]]


def _once(history: list[HistoryEntry] | HistoryLoader) -> HistoryLoader:
    """The history, read at most once per decision and only when asked for."""
    loaded: list[list[HistoryEntry]] = [history] if isinstance(history, list) else []

    async def get() -> list[HistoryEntry]:
        if not loaded:
            assert not isinstance(history, list)
            loaded.append(await history())
        return loaded[0]

    return get


class CascadeConfig(msgspec.Struct, frozen=True, kw_only=True):
    threshold: float = DECIDE_THRESHOLD
    confirm_threshold: float = CONFIRM_THRESHOLD
    detect_multi_intent: bool = True


def decision(
    query_type: QueryType,
    layer: Layer,
    confidence: float,
    *,
    clarity: Clarity = Clarity.CLEAR,
    alternatives: list[Alternative] | None = None,
    resolved_reference: bool = False,
) -> RoutingDecision:
    return RoutingDecision(
        type=query_type,
        layer=layer,
        confidence=round(float(confidence), 4),
        model_slot=slot_for(query_type),
        clarity=clarity,
        alternatives=alternatives or [],
        resolved_reference=resolved_reference,
    )


def _asks_about_account(request: AgentRequest, query_type: QueryType, *, sure: bool) -> bool:
    """RC-02 for data the platform injected: unless the message is surely about AVAP
    docs or code, a request carrying account figures is a PLATFORM request."""
    return has_account_context(request.extra_context) and not (
        sure and query_type in (QueryType.RETRIEVAL, QueryType.CODE_GENERATION)
    )


def _alternatives(pred: Prediction) -> list[Alternative]:
    return [Alternative(QueryType(label), round(float(p), 4)) for label, p in pred.alternatives
            if label in QueryType.__members__][:3]


class Combined(msgspec.Struct, frozen=True):
    """Layer 2's prediction with a non-final rule family's decision as a prior."""

    label: str
    confidence: float
    alternatives: list[tuple[str, float]]


def with_prior(pred: Prediction, hit: RuleHit) -> Combined:
    """Product of Layer 2's distribution and the rule's: the rule gives its type its
    calibrated confidence (its measured precision) and shares the rest evenly. The
    rule's type loses only where Layer 2 is far surer of another one, and the combined
    confidence goes through the clarity gate and Layer 3 like Layer 2's own."""
    dist = {label: float(p) for label, p in pred.alternatives if label in QueryType.__members__}
    dist[pred.label] = float(pred.confidence)
    rest = (1.0 - hit.confidence) / (len(QueryType) - 1)
    score = {t.value: dist.get(t.value, 0.0) * (hit.confidence if t is hit.type else rest)
             for t in QueryType}
    total = sum(score.values())
    if total <= 0.0:  # Layer 2 gave every type zero: the rule alone
        score = {t.value: hit.confidence if t is hit.type else rest for t in QueryType}
        total = 1.0
    ranked = sorted(score.items(), key=lambda kv: -kv[1])
    return Combined(ranked[0][0], ranked[0][1] / total,
                    [(label, p / total) for label, p in ranked[1:]])


class Cascade:
    def __init__(
        self,
        config: CascadeConfig | None = None,
        *,
        layer2: Layer2 | None = None,
        llm: LlmLabeler | None = None,
    ) -> None:
        self.config = config or CascadeConfig()
        self.layer2 = layer2
        self.llm = llm

    def decide_fast(self, request: AgentRequest, *, trusted: bool) -> RoutingDecision | None:
        """Declared type and the final rule families that read the message alone; no
        model, no I/O. `trusted` is the agent's record (stamped by the gateway), never
        something the request says about itself."""
        if request.query_type and trusted:
            return decision(QueryType(request.query_type), Layer.DECLARED, 1.0)
        hit = match_contract(request.query, request.extra_context, trusted=trusted)
        if hit is None:
            hit = match_message(request.query)
        if hit is not None and hit.final:
            return decision(hit.type, Layer.RULES, 1.0)
        return None

    async def decide(
        self,
        request: AgentRequest,
        history: list[HistoryEntry] | HistoryLoader,
        *,
        trusted: bool = False,
        confirm: float | None = None,
    ) -> RoutingDecision:
        """`history` may be a loader: it is then read only if a deictic message or
        Layer 3 needs it, so most decisions cost no store round trip. From an untrusted
        agent a declared query_type is ignored (and the decision says so) and the
        platform prefix is ordinary text. `confirm` is the agent's own clarity
        threshold (ADR-0006), in place of the configured one (ADR-018: 0.65)."""
        if not trusted and has_platform_prefix(request.query):
            request = msgspec.structs.replace(request, query=strip_platform_prefix(request.query))
        chosen = await self._decide(request, history, trusted=trusted,
                                    confirm=self.config.confirm_threshold if confirm is None
                                    else confirm)
        if request.query_type and not trusted:
            log.debug("[classify] ignoring query_type declared by untrusted agent %s",
                     request.agent_id)
            return msgspec.structs.replace(chosen, declared_ignored=True)
        return chosen

    async def _decide(
        self, request: AgentRequest, history: list[HistoryEntry] | HistoryLoader, *,
        trusted: bool, confirm: float,
    ) -> RoutingDecision:
        query, past = request.query, _once(history)
        if request.query_type and trusted:
            return decision(QueryType(request.query_type), Layer.DECLARED, 1.0)
        hit = match_contract(query, request.extra_context, trusted=trusted)
        if hit is not None and trusted and has_platform_prefix(query):
            return decision(hit.type, Layer.RULES, 1.0)  # RC-01: no model at all
        hit = hit or match_message(query)
        if hit is None and points_elsewhere(query):
            hit = match_reference(query, await past(), request.editor_context)
            hit = with_account_figures(hit, request.extra_context) if hit else None
        if hit is not None and hit.final:
            # RC-02 keeps the type; the gate still says when a second request rides along.
            multi = (await self._multi_intent(query)
                     if hit.family in (Family.PLATFORM_DATA, Family.CODE_REQUEST) else None)
            return decision(hit.type, Layer.RULES, 1.0, resolved_reference=hit.resolved_reference,
                            clarity=Clarity.MULTI_INTENT if multi else Clarity.CLEAR,
                            alternatives=multi)
        return await self._learned(request, past, hit, confirm=confirm)

    async def _learned(
        self, request: AgentRequest, past: HistoryLoader, hit: RuleHit | None, *, confirm: float,
    ) -> RoutingDecision:
        """Layer 2 (with a non-final rule family's decision as a prior), the clarity gate
        and Layer 3."""
        query = request.query
        if hit is not None and (self.layer2 is None or hit.family is Family.DEICTIC):
            # Layer 2 reads the message alone: on "explain this" it is no evidence about
            # the referent. The rule's calibrated confidence meets the gate by itself.
            return await self._calibrated(request, past, hit, confirm=confirm)
        if self.layer2 is None:
            return decision(QueryType.RETRIEVAL, Layer.DEFAULT, 0.0)
        pred: Prediction = await self.layer2.predict(query)
        if hit is not None:
            pred = with_prior(pred, hit)
        best = QueryType(pred.label)
        by_rule = hit is not None and hit.type is best
        # The decision follows the rule's resolution of a reference.
        resolved = by_rule and bool(hit and hit.resolved_reference)
        alternatives = _alternatives(pred)
        multi = await self._multi_intent(query) if self.config.detect_multi_intent else None
        if multi is not None:
            return decision(best, Layer.EMBEDDING, pred.confidence,
                            clarity=Clarity.MULTI_INTENT, alternatives=multi)
        confident = pred.confidence >= self.config.threshold
        if _asks_about_account(request, best, sure=confident):
            return decision(QueryType.PLATFORM, Layer.RULES, 1.0, alternatives=alternatives)
        if confident:
            return decision(best, Layer.RULES if by_rule else Layer.EMBEDDING, pred.confidence,
                            alternatives=alternatives, resolved_reference=resolved)

        gate = clarity(pred.confidence, decide=self.config.threshold, confirm=confirm)
        if self.llm is not None:
            # RC-03: the LLM sees the history only to resolve references (stated in its prompt).
            label = await self.llm.label(query, await past(), request.editor_context)
            if label is not None:
                return decision(label, Layer.LLM, pred.confidence, clarity=gate,
                                alternatives=alternatives,
                                resolved_reference=resolved and label is best)
        return decision(best, Layer.FALLBACK, pred.confidence, clarity=gate,
                        alternatives=alternatives, resolved_reference=resolved)

    async def _calibrated(self, request: AgentRequest, past: HistoryLoader, hit: RuleHit, *,
                          confirm: float) -> RoutingDecision:
        """A non-final rule's decision at its calibrated confidence: it decides at or above
        the threshold like Layer 2; below it, Layer 3 (else the rule's type) with the
        clarity gate's outcome."""
        if hit.confidence >= self.config.threshold:
            return decision(hit.type, Layer.RULES, hit.confidence,
                            resolved_reference=hit.resolved_reference)
        gate = clarity(hit.confidence, decide=self.config.threshold, confirm=confirm)
        if self.llm is not None:
            label = await self.llm.label(request.query, await past(), request.editor_context)
            if label is not None:
                return decision(label, Layer.LLM, hit.confidence, clarity=gate,
                                resolved_reference=label is hit.type)
        return decision(hit.type, Layer.FALLBACK, hit.confidence, clarity=gate,
                        resolved_reference=hit.resolved_reference)

    async def _multi_intent(self, query: str) -> list[Alternative] | None:
        """Two parts of the message confidently asking for different types."""
        parts = [p for p in _SPLIT.split(query) if p and len(p.split()) >= 3]
        if len(parts) < 2 or self.layer2 is None or not self.config.detect_multi_intent:
            return None
        found: dict[QueryType, float] = {}
        for part in parts:
            if has_platform_data(part):
                found[QueryType.PLATFORM] = 1.0
                continue
            if points_elsewhere(part):
                continue
            pred = await self.layer2.predict(part)
            if pred.confidence >= self.config.threshold:
                qt = QueryType(pred.label)
                found[qt] = max(found.get(qt, 0.0), float(pred.confidence))
        if len(found) < 2:
            return None
        return [Alternative(t, round(c, 4)) for t, c in sorted(found.items(), key=lambda x: -x[1])]
