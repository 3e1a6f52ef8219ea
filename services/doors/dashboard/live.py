"""The request log's figures of the days not final in the rollups, as the same groups
the rollup statements return (pure): what `DAYS_SQL` and `BREAKDOWN_SQL` would compute
had a refresh stored these rows, what `LATENCY_SQL` and `OUTCOMES_SQL` would read.

`overlay` shows an agent's day from the log wherever the log has rows for it, and from
the rollups elsewhere: the rollups are computed from the log, so where it has the
agent's day it is the fresher of the two; where it has none (a partition dropped, or
no traffic) the rollups are all there is."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from services.doors.dashboard.rows import (
    PER_DAY,
    PER_DAY_LAYER,
    PER_DAY_MODEL,
    PER_DAY_TYPE,
    AgentDayLatency,
    OutcomeGroup,
    RollupGroup,
)
from shared.accounting.rollups import LogRollups

# The sums each grouping carries (DAYS_SQL: all; BREAKDOWN_SQL: requests, tokens, cost).
_ALL = ("requests", "errors", "fallbacks", "tokens_in", "tokens_out", "compute_s", "cost",
        "p50_sum", "p50_n", "p95_sum", "p95_n")
_BREAKDOWN = ("requests", "tokens_in", "tokens_out", "cost")


class LiveFigures(NamedTuple):
    rollups: list[RollupGroup]
    latency: list[AgentDayLatency]
    outcomes: list[OutcomeGroup]


def _sums(row: Mapping[str, Any]) -> dict[str, float]:
    """A rollup row's sums, its percentiles weighted by its requests as DAYS_SQL does."""
    n = int(row["requests"])
    p50, p95 = row["latency_p50_ms"], row["latency_p95_ms"]
    return {"requests": n, "errors": int(row["errors"]), "fallbacks": int(row["fallbacks"]),
            "tokens_in": int(row["tokens_in"] or 0), "tokens_out": int(row["tokens_out"] or 0),
            "compute_s": float(row["compute_s"] or 0.0), "cost": float(row["cost"] or 0.0),
            "p50_sum": p50 * n if p50 is not None else 0.0, "p50_n": n if p50 is not None else 0,
            "p95_sum": p95 * n if p95 is not None else 0.0, "p95_n": n if p95 is not None else 0}


def rollup_groups(rows: Iterable[Mapping[str, Any]]) -> list[RollupGroup]:
    """Rows with `daily_rollups`' columns -> the groups of DAYS_SQL and BREAKDOWN_SQL."""
    acc: dict[tuple[Any, ...], dict[str, float]] = {}

    def add(key: tuple[Any, ...], sums: dict[str, float], fields: tuple[str, ...]) -> None:
        into = acc.setdefault(key, dict.fromkeys(_ALL, 0))
        for field in fields:
            into[field] += sums[field]

    for row in rows:
        sums = _sums(row)
        agent, day = row["agent_id"], row["day"]
        add((agent, day, None, None, None, PER_DAY), sums, _ALL)
        add((agent, day, row["query_type"], None, None, PER_DAY_TYPE), sums, _BREAKDOWN)
        add((agent, day, None, row["layer"], None, PER_DAY_LAYER), sums, _BREAKDOWN)
        add((agent, day, None, None, row["model"], PER_DAY_MODEL), sums, _BREAKDOWN)
    return [RollupGroup(*key, **_typed(sums)) for key, sums in acc.items()]


def _typed(sums: dict[str, float]) -> dict[str, Any]:
    return {k: (float(v) if k in ("compute_s", "cost", "p50_sum", "p95_sum") else int(v))
            for k, v in sums.items()}


def live_figures(log: LogRollups) -> LiveFigures:
    """The log's rows of the days read live -> rollup groups, exact daily latencies and
    errors by code."""
    return LiveFigures(
        rollups=rollup_groups(log.rollups),
        latency=[AgentDayLatency(r["agent_id"], r["day"], int(r["requests"]),
                                 r["latency_p50_ms"], r["latency_p95_ms"])
                 for r in log.latency],
        outcomes=[OutcomeGroup(r["agent_id"], r["day"], r["outcome"], int(r["requests"]))
                  for r in log.outcomes if str(r["outcome"]).startswith("error:")])


def overlay(rolled: LiveFigures, live: LiveFigures) -> LiveFigures:
    """The rolled-up figures with every (agent, day) the log has rows for replaced by
    the log's."""
    fresh = {(g.agent_id, g.day) for g in live.rollups if g.grp == PER_DAY}
    return LiveFigures(
        rollups=[g for g in rolled.rollups if (g.agent_id, g.day) not in fresh] + live.rollups,
        latency=[r for r in rolled.latency if (r.agent_id, r.day) not in fresh] + live.latency,
        outcomes=[o for o in rolled.outcomes if (o.agent_id, o.day) not in fresh]
        + live.outcomes)
