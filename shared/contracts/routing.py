"""Routing vocabulary: query types, deciding layers, model slots, the decision."""

from __future__ import annotations

import enum

import msgspec


class QueryType(enum.StrEnum):
    RETRIEVAL = "RETRIEVAL"
    CODE_GENERATION = "CODE_GENERATION"
    CONVERSATIONAL = "CONVERSATIONAL"
    PLATFORM = "PLATFORM"


class Layer(enum.StrEnum):
    """Which part of the classifier cascade made the decision."""

    DECLARED = "declared"  # caller-declared query_type
    RULES = "rules"  # RC-01 prefix / RC-02 platform data signals
    EMBEDDING = "embedding"  # Layer 2 head above threshold
    LLM = "llm"  # Layer 3 small-LLM classifier
    FALLBACK = "fallback"  # Layer 3 unreachable: Layer 2's best guess
    DEFAULT = "default"  # interim layer of the walking skeleton


class ModelSlot(enum.StrEnum):
    MAIN = "main"
    CONVERSATIONAL = "conversational"


class Clarity(enum.StrEnum):
    """ADR-018 clarity gate outcome."""

    CLEAR = "clear"
    NEEDS_CONFIRMATION = "needs_confirmation"
    NEEDS_CLARIFICATION = "needs_clarification"
    MULTI_INTENT = "multi_intent"


# RC-04: only these types retrieve.
RETRIEVING_TYPES = frozenset({QueryType.RETRIEVAL, QueryType.CODE_GENERATION})


def slot_for(query_type: QueryType) -> ModelSlot:
    """RC-05: RETRIEVAL/CODE_GENERATION on the main slot, the rest on the conversational one."""
    if query_type in RETRIEVING_TYPES:
        return ModelSlot.MAIN
    return ModelSlot.CONVERSATIONAL


class Alternative(msgspec.Struct, frozen=True):
    type: QueryType
    confidence: float


class RoutingDecision(msgspec.Struct, frozen=True):
    type: QueryType
    layer: Layer
    confidence: float
    model_slot: ModelSlot
    clarity: Clarity = Clarity.CLEAR
    alternatives: list[Alternative] = []
    # Set when a deictic reference was resolved from history / editor context.
    resolved_reference: bool = False
    # An untrusted agent declared a query_type, which the cascade ignored.
    declared_ignored: bool = False
    # The session could not be read within its bound (Postgres paused or away): the
    # decision was made without the intent history, as for a session's first turn, or
    # a CONVERSATIONAL answer was written without the previous answer.
    history_unavailable: bool = False


class HistoryEntry(msgspec.Struct, frozen=True):
    """One classify_history turn as the classifier sees it (RC-06)."""

    type: QueryType
    topic: str


TOPIC_MAX_CHARS = 60
HISTORY_WINDOW = 6


def topic_snippet(query: str) -> str:
    """The <=60-character topic kept per turn in classify_history."""
    return " ".join(query.split())[:TOPIC_MAX_CHARS]
