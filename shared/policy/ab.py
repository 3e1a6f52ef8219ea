"""A/B arms and candidate policies: which requests of an agent get the proposal under test.

The arm is a pure function of (agent_id, request_id), so whoever serves a request
(the policy cache in the workers) and whoever evaluates the experiment (the learning
job, in SQL over the request log) agree on it without storing it: the first 32 bits of
md5("<agent_id>:<request_id>") as a fraction of 2^32, below the share. (Agent and
request ids are `[A-Za-z0-9_-]`, so the ':' cannot be forged.)
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import asyncpg

from shared.policy.agent import AgentPolicy, PolicyError, decode_policy

log = logging.getLogger("intentroute.learning")

# The same fraction in SQL (`arm_sql("r.agent_id", "r.request_id")`).
_SCALE = 2**32


def arm_fraction(agent_id: str, request_id: str) -> float:
    digest = hashlib.md5(f"{agent_id}:{request_id}".encode(), usedforsecurity=False)
    return int(digest.hexdigest()[:8], 16) / _SCALE


def in_ab_arm(agent_id: str, request_id: str, share: float) -> bool:
    """True when this request is served the candidate policy (deterministic)."""
    return arm_fraction(agent_id, request_id) < share


def arm_sql(agent_col: str, request_col: str) -> str:
    """SQL for `arm_fraction` of two text columns."""
    return (f"(('x' || substr(md5({agent_col} || ':' || {request_col}), 1, 8))"
            f"::bit(32)::bigint / {float(_SCALE)})")


def effective_policy(base: AgentPolicy, candidate: AgentPolicy | None, agent_id: str,
                     request_id: str, share: float) -> AgentPolicy:
    """The policy a request is served with: the candidate for the A/B arm, else `base`."""
    if candidate is not None and in_ab_arm(agent_id, request_id, share):
        return candidate
    return base


def assignment(key: str, value: Any) -> str:
    """A proposal's (key, JSON value) as the `key=value` that `intentroute agent set`
    takes: the one parser and validator of policy changes."""
    if isinstance(value, list):
        return f"{key}={','.join(str(step) for step in value)}"
    return f"{key}={value}"


def apply_proposal(policy: AgentPolicy, key: str, value: Any) -> AgentPolicy:
    from shared.policy.agent import apply_assignment

    return apply_assignment(policy, assignment(key, value))


_SQL_CANDIDATES = """
SELECT p.agent_id, p.key, p.value::text AS value, p.share, a.settings::text AS settings
FROM learning_proposals p LEFT JOIN agent_policies a ON a.agent_id = p.agent_id
WHERE p.status = 'ab'
ORDER BY p.id
"""


async def load_candidates(
    db: asyncpg.Pool | asyncpg.Connection,
) -> dict[str, tuple[AgentPolicy, float]]:
    """Agent id -> (its current policy with the proposal under A/B applied, the arm's
    share). At most one proposal per agent is in A/B (the job sees to it); the oldest
    wins should a hand-edited table hold two."""
    candidates: dict[str, tuple[AgentPolicy, float]] = {}
    for row in await db.fetch(_SQL_CANDIDATES):
        if row["agent_id"] in candidates:
            continue
        try:
            base = decode_policy(row["settings"]) if row["settings"] else AgentPolicy()
            policy = apply_proposal(base, row["key"], json.loads(row["value"]))
        except (PolicyError, ValueError) as exc:
            # One unreadable row never takes the other agents' experiments away.
            log.error("agent %s: A/B candidate ignored: %s", row["agent_id"], exc)
            continue
        candidates[row["agent_id"]] = (policy, float(row["share"]))
    return candidates
