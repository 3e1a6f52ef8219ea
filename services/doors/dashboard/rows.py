"""The rows the dashboard's statements return, as structs in their column order (built
positionally: ten times faster than by keyword), and the window of days asked for."""

from __future__ import annotations

import datetime as dt

import msgspec

# GROUPING(day, query_type, layer, model): a set bit = that column was aggregated away.
PER_DAY = 0b0111  # (agent_id, day): DAYS_SQL
PER_DAY_TYPE = 0b0011  # (agent_id, day, query_type)
PER_DAY_LAYER = 0b0101  # (agent_id, day, layer)
PER_DAY_MODEL = 0b0110  # (agent_id, day, model)
PER_MODEL = 0b1110  # (agent_id, model) over a window


class RollupGroup(msgspec.Struct, frozen=True):
    """One row of `DAYS_SQL` or `BREAKDOWN_SQL`, fields in their column order (built
    positionally: ten times faster than by keyword); the key columns not in `grp`'s
    set are None."""

    agent_id: str
    day: dt.date | None = None
    query_type: str | None = None
    layer: str | None = None
    model: str | None = None
    grp: int = 0
    requests: int = 0
    errors: int = 0
    fallbacks: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    compute_s: float = 0.0
    cost: float = 0.0
    p50_sum: float = 0.0
    p50_n: int = 0
    p95_sum: float = 0.0
    p95_n: int = 0


class FeedbackGroup(msgspec.Struct, frozen=True):
    """One row of `FEEDBACK_SQL`, fields in its column order."""

    agent_id: str
    day: dt.date
    outcome: str
    n: int
    explicit: int = 0
    implicit: int = 0
    quality_sum: float = 0.0
    quality_n: int = 0


class AgentDayLatency(msgspec.Struct, frozen=True):
    """One row of `LATENCY_SQL`, fields in its column order."""

    agent_id: str
    day: dt.date
    requests: int
    p50_ms: float | None = None
    p95_ms: float | None = None


class OutcomeGroup(msgspec.Struct, frozen=True):
    """Requests of an agent on a day that ended in `outcome` (`error:<CODE>`)."""

    agent_id: str
    day: dt.date
    outcome: str
    requests: int


class ScoreRow(msgspec.Struct, frozen=True):
    """One (agent, model, query type) score of `agent_scores`, with the global rate of
    the same (model, query type) and the divergence the last refresh stored."""

    agent_id: str
    model: str
    query_type: str
    trials: float
    score: float
    global_score: float | None = None
    divergence: float | None = None
    diverged: bool = False
    updated_at: dt.datetime | None = None


class Window(msgspec.Struct, frozen=True):
    """UTC days `since`..`until`, both included."""

    since: dt.date
    until: dt.date

    @classmethod
    def ending(cls, until: dt.date, days: int) -> Window:
        return cls(until - dt.timedelta(days=days - 1), until)

    def days(self) -> list[dt.date]:
        count = (self.until - self.since).days + 1
        return [self.since + dt.timedelta(days=i) for i in range(count)]

    def bounds(self) -> tuple[dt.datetime, dt.datetime]:
        start = dt.datetime.combine(self.since, dt.time(), dt.UTC)
        return start, dt.datetime.combine(self.until, dt.time(), dt.UTC) + dt.timedelta(days=1)
