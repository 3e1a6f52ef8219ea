"""The rows stages write: a turn, its classify_history entry, its request-log line."""

from __future__ import annotations

import msgspec

from shared.contracts.ids import MAX_ID_CHARS, MAX_PART_ID_CHARS


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
    # Accounting (ADR-0006); see shared/store/models.py request_log.
    model: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    tokens_note: str = ""
    first_chunk_ms: float | None = None
    compute_ms: float | None = None
    fallback: bool = False
    fallback_reason: str = ""
    # The parts of an answer several models wrote, [[model, tokens_in, tokens_out], ...]
    # ([] when one did): each is billed at its own model's price (migration 0016).
    model_parts: list[tuple[str, int, int]] = []
    # Epoch seconds the gateway admitted the request (its envelope's `accepted_at`):
    # the row's created_at and partition key, the same for every write of the request.
    # None (no envelope: input the gateway rejected) = an existing row's, else now.
    created_at: float | None = None


Row = HistoryRow | TurnRow | RequestLogRow


_ID_COLUMN = MAX_ID_CHARS  # varchar(128) of every id column
# classify_history's request_id holds a part's id too (`<request_id>#<k>`, migration 0020).
_HISTORY_ID_COLUMN = MAX_PART_ID_CHARS


def _clean(text: str, limit: int | None = None) -> str:
    text = text.replace("\x00", "")
    return text[:limit] if limit is not None else text


def storable(row: Row) -> Row:
    """`row` with values the database cannot hold made storable (NUL characters
    dropped, ids cut to their column): for the rows of an error answer, which may
    describe exactly such input. Valid rows come back unchanged."""
    if isinstance(row, RequestLogRow):
        return msgspec.structs.replace(
            row, request_id=_clean(row.request_id, _ID_COLUMN),
            agent_id=_clean(row.agent_id, _ID_COLUMN),
            session_id=_clean(row.session_id, _ID_COLUMN))
    if isinstance(row, HistoryRow):
        return msgspec.structs.replace(
            row, request_id=_clean(row.request_id, _HISTORY_ID_COLUMN),
            agent_id=_clean(row.agent_id, _ID_COLUMN),
            session_id=_clean(row.session_id, _ID_COLUMN), topic=_clean(row.topic, 60))
    return row
