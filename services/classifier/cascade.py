"""The classifier cascade: pure decision logic over injected layers.

1. caller-declared type (trusted callers only)
2. Layer 1 rules: RC-01 platform prefix, RC-02 platform data
3. later layers (embedding head, LLM) plug in behind `Layer`; until they are
   configured the decision is the interim `default` layer (RETRIEVAL).
"""

from __future__ import annotations

import logging
from typing import Protocol

from services.classifier.rules import has_platform_data, has_platform_prefix
from shared.contracts.request import AgentRequest
from shared.contracts.routing import (
    HistoryEntry,
    Layer,
    QueryType,
    RoutingDecision,
    slot_for,
)

log = logging.getLogger("intentroute.classifier")


class LaterLayer(Protocol):
    """A model-backed layer: returns a decision, or None to let the query fall through."""

    async def decide(
        self, request: AgentRequest, history: list[HistoryEntry]
    ) -> RoutingDecision | None: ...


def decision(query_type: QueryType, layer: Layer, confidence: float) -> RoutingDecision:
    return RoutingDecision(
        type=query_type, layer=layer, confidence=confidence, model_slot=slot_for(query_type)
    )


class Cascade:
    def __init__(
        self,
        *,
        trusted_agents: tuple[str, ...] = ("*",),
        layers: tuple[LaterLayer, ...] = (),
    ) -> None:
        self._trust_all = "*" in trusted_agents
        self._trusted = frozenset(trusted_agents)
        self._layers = layers

    def trusted(self, agent_id: str) -> bool:
        return self._trust_all or agent_id in self._trusted

    def decide_fast(self, request: AgentRequest) -> RoutingDecision | None:
        """Declared type and Layer 1; no model, no I/O."""
        if request.query_type:
            if self.trusted(request.agent_id):
                return decision(QueryType(request.query_type), Layer.DECLARED, 1.0)
            log.info("[classify] ignoring query_type declared by untrusted agent %s",
                     request.agent_id)
        if has_platform_prefix(request.query):
            log.debug("[classify] platform prefix detected -> PLATFORM")
            return decision(QueryType.PLATFORM, Layer.RULES, 1.0)
        if has_platform_data(request.query, request.extra_context):
            return decision(QueryType.PLATFORM, Layer.RULES, 1.0)
        return None

    async def decide(
        self, request: AgentRequest, history: list[HistoryEntry]
    ) -> RoutingDecision:
        fast = self.decide_fast(request)
        if fast is not None:
            return fast
        for layer in self._layers:
            result = await layer.decide(request, history)
            if result is not None:
                return result
        return decision(QueryType.RETRIEVAL, Layer.DEFAULT, 0.0)
