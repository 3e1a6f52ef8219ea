"""The classifier cascade: pure decision logic over injected layers.

1. caller-declared type (trusted agents only)                       layer `declared`
2. Layer 1 rules: RC-01 platform prefix (trusted agents only),
   RC-02 platform data                                                layer `rules`
3. deictic references resolved from history / editor (RC-03 scope)   layer `rules`
4. Layer 2 embedding head: decides at or above the threshold          layer `embedding`
5. Layer 3 LLM with the compact intent history                        layer `llm`
   (no LLM, or it does not answer: Layer 2's best guess)              layer `fallback`

Every decision carries the ADR-018 clarity outcome and its alternatives. Only a
deictic message ever looks at the history; the history never predicts a type.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable

import msgspec

from services.classifier.deixis import is_deictic, is_social, resolve_reference
from services.classifier.ports import Layer2, LlmLabeler, Prediction
from services.classifier.rules import (
    has_account_context,
    has_platform_data,
    has_platform_prefix,
    is_code_request,
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
        """Declared type and Layer 1; no model, no I/O. `trusted` is the agent's record
        (stamped by the gateway), never something the request says about itself."""
        if request.query_type and trusted:
            return decision(QueryType(request.query_type), Layer.DECLARED, 1.0)
        if trusted and has_platform_prefix(request.query):
            log.debug("[classify] platform prefix detected -> PLATFORM")
            return decision(QueryType.PLATFORM, Layer.RULES, 1.0)
        if has_platform_data(request.query, request.extra_context):
            return decision(QueryType.PLATFORM, Layer.RULES, 1.0)
        if is_code_request(request.query):
            return decision(QueryType.CODE_GENERATION, Layer.RULES, 1.0)
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
            log.info("[classify] ignoring query_type declared by untrusted agent %s",
                     request.agent_id)
            return msgspec.structs.replace(chosen, declared_ignored=True)
        return chosen

    async def _decide(
        self, request: AgentRequest, history: list[HistoryEntry] | HistoryLoader, *,
        trusted: bool, confirm: float,
    ) -> RoutingDecision:
        past = _once(history)
        fast = self.decide_fast(request, trusted=trusted)
        query = request.query
        if fast is not None:
            if fast.layer == Layer.RULES and not (trusted and has_platform_prefix(query)):
                # RC-02 keeps the type; the gate still says when a second request rides along.
                multi = await self._multi_intent(query)
                if multi is not None:
                    return decision(fast.type, fast.layer, fast.confidence,
                                    clarity=Clarity.MULTI_INTENT, alternatives=multi)
            return fast
        if is_social(query):
            return decision(QueryType.CONVERSATIONAL, Layer.RULES, 1.0)
        if is_deictic(query):
            referent = resolve_reference(query, await past(), request.editor_context)
            if referent is not None and _asks_about_account(request, referent, sure=True):
                referent = QueryType.PLATFORM  # "¿y ahora qué hago?" next to account figures
            if referent is not None:
                return decision(referent, Layer.RULES, 1.0, resolved_reference=True)
        if self.layer2 is None:
            return decision(QueryType.RETRIEVAL, Layer.DEFAULT, 0.0)

        pred = await self.layer2.predict(query)
        best = QueryType(pred.label)
        alternatives = _alternatives(pred)
        multi = await self._multi_intent(query) if self.config.detect_multi_intent else None
        if multi is not None:
            return decision(best, Layer.EMBEDDING, pred.confidence,
                            clarity=Clarity.MULTI_INTENT, alternatives=multi)
        confident = pred.confidence >= self.config.threshold
        if _asks_about_account(request, best, sure=confident):
            return decision(QueryType.PLATFORM, Layer.RULES, 1.0, alternatives=alternatives)
        if confident:
            return decision(best, Layer.EMBEDDING, pred.confidence, alternatives=alternatives)

        gate = clarity(pred.confidence, decide=self.config.threshold, confirm=confirm)
        if self.llm is not None:
            # RC-03: the LLM sees the history only to resolve references (stated in its prompt).
            label = await self.llm.label(query, await past(), request.editor_context)
            if label is not None:
                return decision(label, Layer.LLM, pred.confidence, clarity=gate,
                                alternatives=alternatives)
        return decision(best, Layer.FALLBACK, pred.confidence, clarity=gate,
                        alternatives=alternatives)

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
            if is_deictic(part):
                continue
            pred = await self.layer2.predict(part)
            if pred.confidence >= self.config.threshold:
                qt = QueryType(pred.label)
                found[qt] = max(found.get(qt, 0.0), float(pred.confidence))
        if len(found) < 2:
            return None
        return [Alternative(t, round(c, 4)) for t, c in sorted(found.items(), key=lambda x: -x[1])]
