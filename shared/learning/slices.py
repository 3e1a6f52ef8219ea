"""Per-agent slices of the request log (ADR-0006 phase 2): one pass over the window,
aggregated in Postgres into the tallies the estimators read (`estimate.Half`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import asyncpg

from shared.learning.estimate import BINS, Half, Tally, pool
from shared.policy.clarity import DECIDE_THRESHOLD
from shared.store.feedback_table import VERDICTS_SQL

# Decisions the clarity threshold governs: Layer 3 and Layer 2's unsure best guess
# (rules, declared types and confident Layer-2 decisions are CLEAR whatever it is).
GATED_LAYERS = ("llm", "fallback")


def value_sql(ask_value: str) -> str:
    """A request's value (see `estimate`): its feedback outcome when it has one, else
    what the pipeline knows. A clarifying question takes only explicit feedback (the
    pipeline cannot know whether it helped). A message answered part by part is worth
    nothing when the agent judged one of its parts anything but a success, unless it
    gave a verdict on the whole message (`OUTCOME_SQL` ranks them alike). `r` is
    request_log, `f` its feedback row and `p` its parts' verdicts (`VERDICTS_SQL`)."""
    return (
        "CASE WHEN f.source = 'explicit' THEN (f.outcome = 'success')::int::float8"
        " WHEN p.outcome <> 'success' THEN 0.0::float8"
        " WHEN f.outcome IS NOT NULL AND r.outcome <> 'clarification'"
        " THEN (f.outcome = 'success')::int::float8"
        " WHEN p.outcome IS NOT NULL THEN 1.0::float8"
        f" WHEN r.outcome = 'clarification' THEN {ask_value}::float8"
        " WHEN r.outcome = 'ok' AND NOT r.fallback"
        " AND r.validation_status <> 'INVALID_UNRESOLVED' THEN 1.0::float8"
        " ELSE 0.0::float8 END"
    )


def gated_sql() -> str:
    layers = ", ".join(f"'{layer}'" for layer in GATED_LAYERS)
    return (f"(r.layer IN ({layers}) AND r.confidence IS NOT NULL"
            f" AND r.confidence < {DECIDE_THRESHOLD})")


FROM_SQL = VERDICTS_SQL

# Two grouping sets in one scan: the clarity gate's (bin, asked?) cells, and the
# (slot, model) cells. `half` splits requests in two by a hash of their id.
_SQL_SLICES = f"""
WITH t AS (
    SELECT r.agent_id, r.model_slot, r.model,
           CASE WHEN {gated_sql()}
                THEN LEAST(GREATEST(floor(r.confidence * {BINS})::int, 0), {BINS - 1}) END
               AS bin,
           r.outcome = 'clarification' AS asked,
           hashtext(r.request_id) & 1 AS half,
           {value_sql("$3")} AS value
    FROM {FROM_SQL}
    WHERE r.created_at >= $1 AND r.created_at < $2
)
SELECT agent_id, model_slot, model, bin, asked, half, count(*) AS n, sum(value) AS v,
       GROUPING(model_slot) AS gate_set
FROM t
GROUP BY GROUPING SETS ((agent_id, bin, asked, half), (agent_id, model_slot, model, half))
"""


@dataclass
class AgentSlice:
    """One agent's window: its requests, and its tallies on each half."""

    agent_id: str
    requests: float = 0.0
    halves: tuple[Half, Half] = field(default_factory=lambda: (Half(), Half()))
    # Whether any of its decisions was answered with a clarifying question.
    asked: bool = False

    @property
    def both(self) -> Half:
        return pool(self.halves)

    def slot_requests(self, slot: str) -> float:
        return sum(t.n for half in self.halves for (s, _), t in half.models.items()
                   if s == slot)


async def load_slices(conn: asyncpg.Connection, since: datetime, until: datetime, *,
                      ask_value: float) -> dict[str, AgentSlice]:
    """Every agent's slice of [since, until)."""
    async with conn.transaction():
        # The join and the hash aggregates fit in memory at 1M rows with this.
        await conn.execute("SET LOCAL work_mem = '64MB'")
        rows = await conn.fetch(_SQL_SLICES, since, until, ask_value)
    slices: dict[str, AgentSlice] = {}
    for row in rows:
        agent = slices.setdefault(row["agent_id"], AgentSlice(row["agent_id"]))
        half = agent.halves[row["half"]]
        n, v = float(row["n"]), float(row["v"])
        if row["gate_set"]:
            if row["bin"] is not None:
                half.gate(row["bin"], row["asked"]).add(n, v)
            if row["asked"]:
                agent.asked = True
        else:
            agent.requests += n
            half.models.setdefault((row["model_slot"], row["model"]), Tally()).add(n, v)
    return slices
