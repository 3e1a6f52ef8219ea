"""`agent_scores` recomputed from the feedback table (shared/policy/confidence.py holds the rule).

`refresh_scores(conn, now)` is the one way scores change: the learning job calls it for
every agent; the gateway calls it for the agents that just sent feedback (`agents=`).
Each refresh

1. counts, per (agent, model, query type), the outcomes of the agents' requests still in
   the request log (`OUTCOME_SQL`: the agent's explicit verdict, else a part it judged
   a failure, else the implicit one the pipeline recorded, else success for a plain
   answer; one outcome per request, its parts' verdicts included, so nothing is counted
   twice), the successes among them and when the latest was observed;
2. sums every agent's counts per (model, query type) into the global rows (agent "*");
3. scores every agent row at `now` (decayed and shrunk toward the global rate), with its
   divergence from it; a row newly beyond the bound is logged for review.

Steps 2 and 3 read `agent_scores` only (a few rows per agent), so a refresh of one agent
costs a scan of that agent's feedback and nothing more. Refreshes are serialized by a
transaction-scoped advisory lock: concurrent ones (gateway replicas, the learning job)
never interleave their writes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple

import asyncpg

from shared.contracts.feedback import FeedbackOutcome, FeedbackSource
from shared.policy.confidence import GLOBAL_AGENT, ConfidenceParams, estimate, global_rate
from shared.store.feedback_table import VERDICTS_SQL

log = logging.getLogger("intentroute.scores")

# pg_advisory_xact_lock key of score refreshes ("intentroute scores").
_LOCK_KEY = 0x1A7E_5C0E

# A request's outcome, over `VERDICTS_SQL` (the request log, the request's own feedback
# row `f`, its parts' verdicts folded into `p`): the agent's verdict on the whole
# request; else a part it judged anything but a success (the message is worth what its
# worst part is); else the implicit verdict the pipeline stored for an answer that went
# wrong; else parts all judged a success, or a plain answer
# (shared.store.writer.implicit_outcome: the implicit outcome of an answered request
# that is not a fallback nor invalid code), a success; else NULL: nothing known (a
# clarification, the caller's own bad input). The dashboard reads it too.
OUTCOME_SQL = f"""CASE
    WHEN f.source = '{FeedbackSource.EXPLICIT.value}' THEN f.outcome
    WHEN p.outcome <> '{FeedbackOutcome.SUCCESS.value}' THEN p.outcome
    WHEN f.outcome IS NOT NULL THEN f.outcome
    WHEN p.outcome IS NOT NULL THEN p.outcome
    WHEN r.outcome = 'ok' AND NOT r.fallback
         AND r.validation_status <> 'INVALID_UNRESOLVED' THEN 'success'
END"""

_SQL_COUNTS = """
WITH outcomes AS (
    SELECT r.agent_id, r.model, r.query_type, {outcome} AS outcome,
           coalesce(f.updated_at, p.updated_at, r.created_at) AS seen
    FROM {verdicts}
    {where}
)
SELECT agent_id, model, query_type,
       count(*)::float8 AS trials,
       (count(*) FILTER (WHERE outcome = $1))::float8 AS successes,
       max(seen) AS last_seen
FROM outcomes
WHERE outcome IS NOT NULL
GROUP BY agent_id, model, query_type
"""
# Two statements rather than `$2 IS NULL OR ...`, so that a refresh of some agents reads
# their rows by the primary keys' agent_id prefix instead of the whole request log.
_SQL_COUNTS_ALL = _SQL_COUNTS.format(outcome=OUTCOME_SQL, verdicts=VERDICTS_SQL, where="")
_SQL_COUNTS_SOME = _SQL_COUNTS.format(outcome=OUTCOME_SQL, verdicts=VERDICTS_SQL,
                                      where="WHERE r.agent_id = ANY($2::text[])")

_SQL_DELETE_ALL = "DELETE FROM agent_scores WHERE agent_id <> $1"
_SQL_DELETE_SOME = "DELETE FROM agent_scores WHERE agent_id = ANY($1::text[])"

# Counts only: scores, divergence and flags are written by step 3. A slice that existed
# keeps its flag (so a divergence is logged once, when it appears).
_SQL_UPSERT_COUNTS = """
INSERT INTO agent_scores (agent_id, model, query_type, successes, trials, last_seen, diverged)
SELECT a, m, q, s, n, ls, coalesce(d, false)
FROM unnest($1::text[], $2::text[], $3::text[], $4::float8[], $5::float8[],
            $6::timestamptz[], $7::bool[]) AS u(a, m, q, s, n, ls, d)
ON CONFLICT (agent_id, model, query_type) DO UPDATE SET
    successes = EXCLUDED.successes, trials = EXCLUDED.trials, last_seen = EXCLUDED.last_seen
"""

_SQL_ROWS = """
SELECT agent_id, model, query_type, successes, trials, last_seen, diverged
FROM agent_scores
"""

_SQL_WRITE_SCORES = """
UPDATE agent_scores t
SET score = u.score, divergence = u.divergence, diverged = u.diverged, updated_at = $7
FROM unnest($1::text[], $2::text[], $3::text[], $4::float8[], $5::float8[], $6::bool[])
    AS u(a, m, q, score, divergence, diverged)
WHERE t.agent_id = u.a AND t.model = u.m AND t.query_type = u.q
"""

_SQL_DELETE_STALE_GLOBAL = """
DELETE FROM agent_scores g
WHERE g.agent_id = $1 AND NOT EXISTS (
    SELECT 1 FROM agent_scores a
    WHERE a.agent_id <> $1 AND a.model = g.model AND a.query_type = g.query_type)
"""


class Divergence(NamedTuple):
    agent_id: str
    model: str
    query_type: str
    score: float
    global_score: float


class RefreshReport(NamedTuple):
    agents: int  # agents whose counts were recomputed
    rows: int  # agent rows scored (every agent's)
    diverged: list[Divergence]  # rows beyond the bound now
    newly_diverged: list[Divergence]  # ... that were not at the previous refresh


async def refresh_scores(
    conn: asyncpg.Connection,
    now: datetime,
    *,
    agents: Sequence[str] | None = None,
    params: ConfidenceParams | None = None,
) -> RefreshReport:
    """Recompute the counts of `agents` (None: every agent) from the feedback table,
    the global rows, and every agent row's score at `now` (module doc)."""
    params = params or ConfidenceParams()
    only = list(agents) if agents is not None else None
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
        flagged = {
            (r["agent_id"], r["model"], r["query_type"]): bool(r["diverged"])
            for r in await conn.fetch(_SQL_ROWS)
        }
        success = FeedbackOutcome.SUCCESS.value
        if only is None:
            counts = await conn.fetch(_SQL_COUNTS_ALL, success)
            await conn.execute(_SQL_DELETE_ALL, GLOBAL_AGENT)
        else:
            only = [a for a in only if a != GLOBAL_AGENT]
            counts = await conn.fetch(_SQL_COUNTS_SOME, success, only)
            await conn.execute(_SQL_DELETE_SOME, only)
        if counts:
            keys = [(r["agent_id"], r["model"], r["query_type"]) for r in counts]
            await conn.execute(
                _SQL_UPSERT_COUNTS,
                [k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys],
                [r["successes"] for r in counts], [r["trials"] for r in counts],
                [r["last_seen"] for r in counts], [flagged.get(k, False) for k in keys])
        rows = await conn.fetch(_SQL_ROWS)
        report = await _score(conn, rows, flagged, now, params)
    for d in report.newly_diverged:
        log.warning(
            "[scores] agent %r model %r type %r diverges from the global rate: "
            "score %.3f vs global %.3f (bound ±%.2f); flagged for review",
            d.agent_id, d.model, d.query_type, d.score, d.global_score,
            params.divergence_bound)
    agents_done = len({r["agent_id"] for r in counts}) if only is None else len(only)
    return report._replace(agents=agents_done)


async def _score(
    conn: asyncpg.Connection,
    rows: Sequence[asyncpg.Record],
    flagged: dict[tuple[str, str, str], bool],
    now: datetime,
    params: ConfidenceParams,
) -> RefreshReport:
    """Steps 2 and 3: the global rows from the agent rows, then every row's score."""
    sums: dict[tuple[str, str], list[float]] = {}
    seen: dict[tuple[str, str], datetime | None] = {}
    agent_rows = [r for r in rows if r["agent_id"] != GLOBAL_AGENT]
    for r in agent_rows:
        pair = (r["model"], r["query_type"])
        acc = sums.setdefault(pair, [0.0, 0.0])
        acc[0] += r["successes"]
        acc[1] += r["trials"]
        last, prev = r["last_seen"], seen.get(pair)
        seen[pair] = last if prev is None else (prev if last is None else max(prev, last))
    globals_ = {pair: global_rate(s, n, params) for pair, (s, n) in sums.items()}
    if sums:
        pairs = list(sums)
        await conn.execute(
            _SQL_UPSERT_COUNTS,
            [GLOBAL_AGENT] * len(pairs), [p[0] for p in pairs], [p[1] for p in pairs],
            [sums[p][0] for p in pairs], [sums[p][1] for p in pairs],
            [seen[p] for p in pairs], [False] * len(pairs))
    await conn.execute(_SQL_DELETE_STALE_GLOBAL, GLOBAL_AGENT)

    out: list[tuple[str, str, str, float, float, bool]] = []
    diverged: list[Divergence] = []
    newly: list[Divergence] = []
    for r in agent_rows:
        agent, model, qtype = r["agent_id"], r["model"], r["query_type"]
        g = globals_[(model, qtype)]
        est = estimate(r["successes"], r["trials"], r["last_seen"], g, now, params)
        out.append((agent, model, qtype, est.score, est.divergence, est.diverged))
        if est.diverged:
            d = Divergence(agent, model, qtype, score=est.score, global_score=g)
            diverged.append(d)
            if not flagged.get((agent, model, qtype), False):
                newly.append(d)
    out += [(GLOBAL_AGENT, model, qtype, g, 0.0, False)
            for (model, qtype), g in globals_.items()]
    if out:
        await conn.execute(_SQL_WRITE_SCORES, *(list(col) for col in zip(*out, strict=True)),
                           now)
    return RefreshReport(agents=0, rows=len(agent_rows), diverged=diverged, newly_diverged=newly)
