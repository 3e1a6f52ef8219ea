"""Who is calling: agent records read from the `agents` table, cached briefly.

The gateway asks on every request (is the agent still active, is it trusted) and on
every authenticated gRPC / HTTP call (does this bearer token belong to it). Both go
through a short cache so the hot path costs a dict lookup; its TTL bounds how long a
revocation or a trust change takes to reach running workers.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import secrets
import time
from collections.abc import Awaitable, Callable

import bcrypt

from shared.auth.ports import AgentInfo


def bearer_value(authorization: str) -> str:
    """The token of an `Authorization: Bearer <token>` value ("" if it is not one): the
    one parser of the gateway's HTTP, gRPC and dashboard credentials."""
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""

# (record, bcrypt hash of its secret), or None when there is no such agent.
FetchAgent = Callable[[str], Awaitable[tuple[AgentInfo, str] | None]]

DEFAULT_TTL = 5.0
# nats-server checks the hash on every connect: cost 10 keeps that near 50 ms.
BCRYPT_COST = 10


def hash_secret(secret: str) -> str:
    return bcrypt.hashpw(secret.encode(), bcrypt.gensalt(BCRYPT_COST)).decode()


def check_secret(secret: str, secret_hash: str) -> bool:
    """Constant-time comparison; a secret bcrypt cannot take (over 72 bytes) or a
    malformed stored hash never matches."""
    try:
        return bcrypt.checkpw(secret.encode(), secret_hash.encode())
    except ValueError:
        return False


@functools.cache
def _decoy_hash() -> str:
    # Checked against when the agent is unknown, so the answer takes as long as for
    # a known agent and timing does not tell which ids exist.
    return hash_secret(secrets.token_urlsafe(32))


def check_or_decoy(secret: str, secret_hash: str) -> bool:
    """`check_secret`, spending the same bcrypt time when there is no hash to check."""
    return check_secret(secret, secret_hash or _decoy_hash()) and bool(secret_hash)


def agent_token(agent_id: str, secret: str) -> str:
    """The bearer token of gRPC and HTTP calls."""
    return f"{agent_id}.{secret}"


def split_token(token: str) -> tuple[str, str]:
    """`<agent_id>.<secret>` -> (agent id, secret); agent ids hold no `.`, so the first
    one separates them."""
    agent_id, _, secret = token.strip().partition(".")
    return agent_id, secret


class CachedAgents:
    """`AgentDirectory` over a fetch function, with a TTL cache for records and for
    verified tokens (bcrypt costs milliseconds on purpose; it runs in a thread)."""

    def __init__(self, fetch: FetchAgent, *, ttl: float = DEFAULT_TTL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._fetch = fetch
        self._ttl = ttl
        self._clock = clock
        self._records: dict[str, tuple[float, tuple[AgentInfo, str] | None]] = {}
        self._tokens: dict[bytes, tuple[float, str]] = {}

    async def _record(self, agent_id: str) -> tuple[AgentInfo, str] | None:
        now = self._clock()
        hit = self._records.get(agent_id)
        if hit is not None and hit[0] > now:
            return hit[1]
        record = await self._fetch(agent_id)
        self._records[agent_id] = (now + self._ttl, record)
        return record

    async def get(self, agent_id: str) -> AgentInfo | None:
        record = await self._record(agent_id)
        return record[0] if record else None

    async def verify_token(self, token: str) -> AgentInfo | None:
        """The active agent a bearer token belongs to, or None."""
        agent_id, secret = split_token(token)
        record = await self._record(agent_id) if agent_id and secret else None
        secret_hash = record[1] if record else ""
        key = hashlib.sha256(token.encode()).digest()
        now = self._clock()
        hit = self._tokens.get(key)
        if record is not None and hit is not None and hit[0] > now and hit[1] == secret_hash:
            return None if record[0].revoked else record[0]
        ok = await asyncio.to_thread(check_or_decoy, secret, secret_hash)
        if not ok or record is None or record[0].revoked:
            return None
        info = record[0]
        self._tokens[key] = (now + self._ttl, secret_hash)
        return info
