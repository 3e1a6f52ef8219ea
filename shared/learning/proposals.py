"""The `learning_proposals` table: a proposal's life from observe to promoted/rejected."""

from __future__ import annotations

import enum
import json
from datetime import datetime
from typing import Any

import asyncpg
import msgspec

from shared.policy.ab import apply_proposal
from shared.policy.agent import SLOTS, AgentPolicy, PolicyError


class Status(enum.StrEnum):
    OBSERVE = "observe"  # waiting for (or in) the observe-mode replay
    AB = "ab"  # served to the A/B share of the agent's traffic
    PROMOTED = "promoted"  # saved into agent_policies
    REJECTED = "rejected"


OPEN = (Status.OBSERVE.value, Status.AB.value)

# The policy keys a proposal may change: the ones observe mode can replay.
KEYS = ("clarity_threshold", *(f"fallback.{slot}" for slot in SLOTS))


class Proposal(msgspec.Struct, kw_only=True):
    id: int
    agent_id: str
    key: str
    value: Any
    status: Status
    origin: str
    baseline: Any
    figures: dict[str, Any]
    share: float | None
    created_at: datetime
    ab_started_at: datetime | None
    decided_at: datetime | None
    reason: str


def parse_assignment(assignment: str) -> tuple[str, Any]:
    """`key=value` (as `intentroute agent set` takes it) -> (key, JSON value), validated."""
    key, _, raw = assignment.partition("=")
    key = key.strip()
    if key not in KEYS:
        raise PolicyError(f"{key!r}: a proposal may set only {', '.join(KEYS)}")
    policy = apply_proposal(AgentPolicy(), key, raw.strip())
    if key == "clarity_threshold":
        if policy.clarity_threshold is None:
            raise PolicyError("clarity_threshold: a proposal needs a value")
        return key, policy.clarity_threshold
    chain = policy.fallback.get(key.partition(".")[2])
    if not chain:
        raise PolicyError(f"{key}: a proposal needs a chain")
    return key, chain


_COLUMNS = ("id, agent_id, key, value::text AS value, status, origin, baseline::text AS "
            "baseline, figures::text AS figures, share, created_at, ab_started_at, "
            "decided_at, reason")


def _proposal(row: asyncpg.Record) -> Proposal:
    return Proposal(
        id=row["id"], agent_id=row["agent_id"], key=row["key"], value=json.loads(row["value"]),
        status=Status(row["status"]), origin=row["origin"],
        baseline=json.loads(row["baseline"]), figures=json.loads(row["figures"]),
        share=row["share"], created_at=row["created_at"], ab_started_at=row["ab_started_at"],
        decided_at=row["decided_at"], reason=row["reason"],
    )


async def insert(conn: asyncpg.Connection, *, agent_id: str, key: str, value: Any,
                 baseline: Any, figures: dict[str, Any], origin: str, now: datetime) -> int:
    proposal_id: int = await conn.fetchval(
        "INSERT INTO learning_proposals (agent_id, key, value, status, origin, baseline, "
        "figures, created_at) VALUES ($1, $2, $3::jsonb, 'observe', $4, $5::jsonb, $6::jsonb,"
        " $7) RETURNING id",
        agent_id, key, json.dumps(value), origin, json.dumps(baseline), json.dumps(figures),
        now)
    return proposal_id


async def with_status(conn: asyncpg.Connection, *statuses: str) -> list[Proposal]:
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} FROM learning_proposals WHERE status = ANY($1::text[]) "
        "ORDER BY id", list(statuses))
    return [_proposal(row) for row in rows]


async def listing(conn: asyncpg.Connection, agent_id: str | None = None,
                  limit: int = 100) -> list[Proposal]:
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} FROM learning_proposals WHERE $1::text IS NULL OR agent_id = $1 "
        "ORDER BY id DESC LIMIT $2", agent_id, limit)
    return [_proposal(row) for row in rows]


async def recently_rejected(conn: asyncpg.Connection, since: datetime) -> set[tuple[str, str]]:
    """(agent, key) of the job's own proposals rejected since `since`: the job leaves
    that key of that agent alone for a while (an operator's rejected idea does not)."""
    rows = await conn.fetch(
        "SELECT DISTINCT agent_id, key FROM learning_proposals "
        "WHERE status = 'rejected' AND origin = 'learn' AND decided_at >= $1", since)
    return {(r["agent_id"], r["key"]) for r in rows}


async def start_ab(conn: asyncpg.Connection, proposal_id: int, *, share: float,
                   figures: dict[str, Any], now: datetime) -> None:
    await conn.execute(
        "UPDATE learning_proposals SET status = 'ab', share = $2, ab_started_at = $3, "
        "figures = $4::jsonb WHERE id = $1 AND status = 'observe'",
        proposal_id, share, now, json.dumps(figures))


async def update_figures(conn: asyncpg.Connection, proposal_id: int,
                         figures: dict[str, Any]) -> None:
    await conn.execute("UPDATE learning_proposals SET figures = $2::jsonb WHERE id = $1",
                       proposal_id, json.dumps(figures))


async def decide(conn: asyncpg.Connection, proposal_id: int, status: Status, *,
                 figures: dict[str, Any], reason: str, now: datetime) -> None:
    await conn.execute(
        "UPDATE learning_proposals SET status = $2, figures = $3::jsonb, reason = $4, "
        "decided_at = $5 WHERE id = $1",
        proposal_id, status.value, json.dumps(figures), reason, now)
