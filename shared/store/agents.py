"""Agents as records: who may call the bus, with which secret, trusted or not.

Off the hot path (the CLI, the stack's auth sync, the gateway's credential check
behind a cache). A secret is generated here, handed out once in a credential and
stored only as its bcrypt hash and the fast digest keyed by it (shared.auth.identity);
the same hash is the agent's NATS password hash, so one secret opens NATS (user = agent
id) and gRPC/HTTP (bearer `<agent_id>.<secret>`).
"""

from __future__ import annotations

import asyncio
import builtins
import secrets
from datetime import datetime

import asyncpg
import msgspec

from shared.auth.identity import (
    agent_token,
    check_or_decoy,
    digest_matches,
    hash_secret,
    split_token,
    token_digest,
)
from shared.auth.natsconn import Credential, user_credential
from shared.auth.permissions import agent_id_problem
from shared.store import asyncpg_dsn


class AgentError(Exception):
    """An agent operation that cannot be done; the message says why."""


class InvalidAgentIdError(AgentError):
    pass


class AgentExistsError(AgentError):
    pass


class UnknownAgentError(AgentError):
    pass


class AgentRecord(msgspec.Struct, frozen=True, kw_only=True):
    agent_id: str
    trusted: bool
    created_at: datetime
    updated_at: datetime
    revoked_at: datetime | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


def new_credential(agent_id: str, secret: str) -> Credential:
    return user_credential(agent_id, secret, token=agent_token(agent_id, secret))


_COLUMNS = "agent_id, trusted, created_at, updated_at, revoked_at"


class AgentStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @classmethod
    async def connect(cls, database_url: str) -> AgentStore:
        pool = await asyncpg.create_pool(asyncpg_dsn(database_url), min_size=1, max_size=2)
        return cls(pool)

    async def close(self) -> None:
        await self._pool.close()

    async def add(self, agent_id: str, *, trusted: bool = False) -> Credential:
        """Create an agent; its credential (with the secret) is returned only here."""
        problem = agent_id_problem(agent_id)
        if problem:
            raise InvalidAgentIdError(problem)
        secret = secrets.token_urlsafe(32)
        secret_hash = await asyncio.to_thread(hash_secret, secret)
        status = await self._pool.execute(
            "INSERT INTO agents (agent_id, secret_hash, secret_digest, trusted) "
            "VALUES ($1, $2, $3, $4) ON CONFLICT (agent_id) DO NOTHING",
            agent_id, secret_hash, token_digest(secret, secret_hash), trusted,
        )
        if status.endswith(" 0"):
            raise AgentExistsError(f"agent {agent_id!r} exists (revoked agents keep their id)")
        return new_credential(agent_id, secret)

    async def discard(self, agent_id: str) -> bool:
        """Undo an `add` that did not take effect (NATS refused the reload, its credential
        was never handed out): the row goes, so adding the id again works. False when
        there was no such active agent (a revoked agent's row stays)."""
        status = await self._pool.execute(
            "DELETE FROM agents WHERE agent_id = $1 AND revoked_at IS NULL", agent_id)
        return not status.endswith(" 0")

    async def rotate(self, agent_id: str) -> Credential:
        """A new secret for an active agent (the old one stops working); its credential
        is returned only here."""
        secret = secrets.token_urlsafe(32)
        secret_hash = await asyncio.to_thread(hash_secret, secret)
        status = await self._pool.execute(
            "UPDATE agents SET secret_hash = $2, secret_digest = $3, updated_at = now() "
            "WHERE agent_id = $1 AND revoked_at IS NULL",
            agent_id, secret_hash, token_digest(secret, secret_hash),
        )
        if status.endswith(" 0"):
            raise UnknownAgentError(f"no active agent {agent_id!r}")
        return new_credential(agent_id, secret)

    async def get(self, agent_id: str) -> AgentRecord | None:
        row = await self._pool.fetchrow(
            f"SELECT {_COLUMNS} FROM agents WHERE agent_id = $1", agent_id
        )
        return _record(row) if row else None

    async def revoke(self, agent_id: str) -> AgentRecord:
        """Revoke (the row stays); revoking twice keeps the first revocation time."""
        row = await self._pool.fetchrow(
            "UPDATE agents SET revoked_at = coalesce(revoked_at, now()), updated_at = now() "
            f"WHERE agent_id = $1 RETURNING {_COLUMNS}",
            agent_id,
        )
        if row is None:
            raise UnknownAgentError(f"no agent {agent_id!r}")
        return _record(row)

    async def set_trusted(self, agent_id: str, trusted: bool) -> AgentRecord:
        row = await self._pool.fetchrow(
            f"UPDATE agents SET trusted = $2, updated_at = now() WHERE agent_id = $1 "
            f"RETURNING {_COLUMNS}",
            agent_id, trusted,
        )
        if row is None:
            raise UnknownAgentError(f"no agent {agent_id!r}")
        return _record(row)

    async def active_hashes(self) -> builtins.list[tuple[str, str]]:
        """(agent id, secret hash) of every agent not revoked: the NATS users."""
        rows = await self._pool.fetch(
            "SELECT agent_id, secret_hash FROM agents WHERE revoked_at IS NULL "
            "ORDER BY agent_id"
        )
        return [(r["agent_id"], r["secret_hash"]) for r in rows]

    async def digest(self) -> str:
        """Changes whenever the NATS users would (an id, a hash or a revocation), however
        the table was changed, SQL by hand included."""
        value = await self._pool.fetchval(
            "SELECT md5(coalesce(string_agg(agent_id || ':' || secret_hash || ':' || "
            "(revoked_at IS NULL)::text, ',' ORDER BY agent_id), '')) FROM agents"
        )
        return str(value)

    async def verify_token(self, token: str) -> AgentRecord | None:
        """The active agent a bearer token belongs to, or None (unknown, revoked or a
        wrong secret). Checked against the secret's digest; an agent without one yet
        (added before it existed) with bcrypt, and its digest stored on success, which
        is how `intentroute up` upgrades the agents it holds credentials for."""
        agent_id, secret = split_token(token)
        row = None
        if agent_id and not agent_id_problem(agent_id):
            row = await self._pool.fetchrow(
                f"SELECT {_COLUMNS}, secret_hash, secret_digest FROM agents "
                "WHERE agent_id = $1", agent_id
            )
        if row is not None and row["secret_digest"]:
            ok = digest_matches(secret, row["secret_hash"], row["secret_digest"])
        else:
            secret_hash = row["secret_hash"] if row else ""
            ok = await asyncio.to_thread(check_or_decoy, secret, secret_hash)
            if ok and token_digest(secret, secret_hash):
                await self._pool.execute(
                    "UPDATE agents SET secret_digest = $3 "
                    "WHERE agent_id = $1 AND secret_hash = $2",
                    agent_id, secret_hash, token_digest(secret, secret_hash))
        if not (ok and row is not None and row["revoked_at"] is None):
            return None
        return _record(row)

    async def list(self) -> builtins.list[AgentRecord]:
        rows = await self._pool.fetch(f"SELECT {_COLUMNS} FROM agents ORDER BY agent_id")
        return [_record(r) for r in rows]


def _record(row: asyncpg.Record) -> AgentRecord:
    return AgentRecord(
        agent_id=row["agent_id"], trusted=row["trusted"], created_at=row["created_at"],
        updated_at=row["updated_at"], revoked_at=row["revoked_at"],
    )
