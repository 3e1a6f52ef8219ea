"""Agents for the tests, created as `intentroute agent add` creates them: a row in the
`agents` table with the bcrypt hash of a fresh secret."""

from __future__ import annotations

import secrets

import asyncpg
import bcrypt

from shared.store import asyncpg_dsn

# The agents the integration tests ask as; "tests" is trusted (it declares query types).
TEST_AGENTS = {"tests": True, "agent-a": False, "agent-b": False, "grpc": False,
               "untrusted": False}


async def ensure_agent(database_url: str, agent_id: str, *, trusted: bool = False) -> str:
    """Create (or re-key and un-revoke) `agent_id`; returns its bearer token."""
    secret = secrets.token_urlsafe(24)
    secret_hash = bcrypt.hashpw(secret.encode(), bcrypt.gensalt(rounds=10)).decode()
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        await conn.execute(
            "INSERT INTO agents (agent_id, secret_hash, trusted) VALUES ($1, $2, $3) "
            "ON CONFLICT (agent_id) DO UPDATE SET secret_hash = EXCLUDED.secret_hash, "
            "trusted = EXCLUDED.trusted, revoked_at = NULL, updated_at = now()",
            agent_id, secret_hash, trusted)
    finally:
        await conn.close()
    return f"{agent_id}.{secret}"
