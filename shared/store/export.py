"""classify_history -> labelled JSONL, the data flywheel's export (offline, ORM is fine)."""

from __future__ import annotations

import json
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from shared.store import sqlalchemy_url
from shared.store.models import classify_history

# Guesses made without a confident layer are not labels.
UNRELIABLE_LAYERS = ("fallback", "default")


async def export_history(
    database_url: str, out: Path, *, include_fallback: bool = False, min_confidence: float = 0.0,
    agent_id: str | None = None,
) -> int:
    """Write the labelled decisions (of one agent when `agent_id` is given: an agent's
    own traffic trains its own head, or a test reads only what it wrote)."""
    query = sa.select(
        classify_history.c.topic,
        classify_history.c.type,
        classify_history.c.layer,
        classify_history.c.confidence,
    ).order_by(classify_history.c.id)
    if not include_fallback:
        query = query.where(classify_history.c.layer.not_in(UNRELIABLE_LAYERS))
    if agent_id is not None:
        query = query.where(classify_history.c.agent_id == agent_id)
    if min_confidence > 0:
        query = query.where(classify_history.c.confidence >= min_confidence)
    engine = create_async_engine(sqlalchemy_url(database_url))
    count = 0
    try:
        async with engine.connect() as conn:
            result = await conn.stream(query)
            with out.open("w", encoding="utf-8") as fh:
                async for row in result:
                    fh.write(json.dumps({"topic": row.topic, "type": row.type,
                                         "layer": row.layer, "confidence": row.confidence},
                                        ensure_ascii=False) + "\n")
                    count += 1
    finally:
        await engine.dispose()
    return count
