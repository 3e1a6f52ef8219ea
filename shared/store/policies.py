"""Reading and writing per-agent policies (`agent_policies`)."""

from __future__ import annotations

import logging

import asyncpg

from shared.policy.agent import (
    AgentPolicy,
    PolicyError,
    apply_assignment,
    decode_policy,
    encode_policy,
)

log = logging.getLogger("intentroute.store")

_SQL_ALL = "SELECT agent_id, settings::text AS settings FROM agent_policies"
_SQL_ONE = "SELECT settings::text FROM agent_policies WHERE agent_id = $1"
_SQL_SAVE = """
INSERT INTO agent_policies (agent_id, settings, updated_at) VALUES ($1, $2::jsonb, now())
ON CONFLICT (agent_id) DO UPDATE SET settings = EXCLUDED.settings, updated_at = now()
"""


async def load_policies(db: asyncpg.Pool | asyncpg.Connection) -> dict[str, AgentPolicy]:
    """Every agent's policy. A row that no longer decodes (hand-edited) is skipped and
    logged: one bad row never takes the others' policies away."""
    policies: dict[str, AgentPolicy] = {}
    for row in await db.fetch(_SQL_ALL):
        try:
            policies[row["agent_id"]] = decode_policy(row["settings"])
        except (PolicyError, ValueError) as exc:
            log.error("agent %s: unreadable policy ignored: %s", row["agent_id"], exc)
    return policies


async def load_policy(db: asyncpg.Pool | asyncpg.Connection, agent_id: str) -> AgentPolicy:
    raw = await db.fetchval(_SQL_ONE, agent_id)
    return decode_policy(raw) if raw is not None else AgentPolicy()


async def save_policy(db: asyncpg.Pool | asyncpg.Connection, agent_id: str,
                      policy: AgentPolicy) -> None:
    await db.execute(_SQL_SAVE, agent_id, encode_policy(policy))


class UnknownPolicyAgentError(PolicyError):
    """A policy for an agent the agents table does not know."""


async def update_policy(pool: asyncpg.Pool, agent_id: str,
                        assignments: list[str]) -> AgentPolicy:
    """Apply `key=value` assignments to an agent's stored policy and save the result, in
    one transaction that locks the agent's row (two concurrent updates both land).
    Nothing is saved when the agent is unknown or an assignment is refused."""
    async with pool.acquire() as conn, conn.transaction():
        known = await conn.fetchval(
            "SELECT 1 FROM agents WHERE agent_id = $1 FOR UPDATE", agent_id)
        if known is None:
            raise UnknownPolicyAgentError(f"no agent {agent_id!r}")
        policy = await load_policy(conn, agent_id)
        for assignment in assignments:
            policy = apply_assignment(policy, assignment)
        await save_policy(conn, agent_id, policy)
    return policy


async def show_policy(pool: asyncpg.Pool, agent_id: str) -> AgentPolicy:
    """An agent's stored policy (empty when it has none); unknown agents are an error."""
    if await pool.fetchval("SELECT 1 FROM agents WHERE agent_id = $1", agent_id) is None:
        raise UnknownPolicyAgentError(f"no agent {agent_id!r}")
    return await load_policy(pool, agent_id)
