"""The rows stages write: a turn, its classify_history entry, its request-log line."""

from __future__ import annotations

import msgspec


class HistoryRow(msgspec.Struct, frozen=True):
    agent_id: str
    session_id: str
    request_id: str
    type: str
    topic: str
    layer: str
    confidence: float


class TurnRow(msgspec.Struct, frozen=True):
    """One finished turn: the user's query and the assistant's answer."""

    agent_id: str
    session_id: str
    request_id: str
    query: str
    answer: str
    query_type: str


class RequestLogRow(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    agent_id: str
    session_id: str
    outcome: str
    query_type: str = ""
    layer: str = ""
    confidence: float | None = None
    model_slot: str = ""
    answered_by: str = ""
    stage_ms: dict[str, float] = {}
    total_ms: float | None = None
    validation_status: str = ""
    retried: bool = False


Row = HistoryRow | TurnRow | RequestLogRow
