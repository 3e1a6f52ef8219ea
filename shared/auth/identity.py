"""Who is calling: agent records read from the `agents` table, cached briefly.

The gateway asks on every request (is the agent still active, is it trusted) and on
every authenticated gRPC / HTTP call (does this bearer token belong to it). Records go
through a short cache so the hot path costs a dict lookup. A change to an agent's row
is pushed by Postgres (shared.store.agent_changes) and drops its record at once, so a
revocation or a trust change reaches the doors within a round trip; the TTL bounds how
long a record can be stale while that push is not heard.

A token's secret is checked two ways. bcrypt (`hash_secret`, ~60 ms of CPU) is what
nats-server checks on connect, so every agent has that hash. Beside it the row keeps
`token_digest`, an HMAC-SHA256 of the secret (~3 us): a secret is 256 random bits, not
a password, so there is nothing for a slow hash to protect against and the gateway can
check every token it is shown, however many wrong ones come with it. bcrypt is left
for agents whose digest is not written yet (it is written on their first bcrypt check).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Awaitable, Callable

import bcrypt
import msgspec

from shared.auth.permissions import agent_id_problem
from shared.auth.ports import AgentInfo, HashGate

log = logging.getLogger("intentroute.auth")


def bearer_value(authorization: str) -> str:
    """The token of an `Authorization: Bearer <token>` value ("" if it is not one): the
    one parser of the doors' HTTP, gRPC and dashboard credentials."""
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class AgentSecret(msgspec.Struct, frozen=True):
    """An agent's record and what its token's secret is checked against."""

    info: AgentInfo
    # bcrypt hash of the secret (also the NATS password hash).
    secret_hash: str
    # token_digest(secret, secret_hash); "" until the secret was checked with bcrypt.
    secret_digest: str = ""


# The record of an agent id, or None when there is no such agent.
FetchAgent = Callable[[str], Awaitable[AgentSecret | None]]
# Store a digest: (agent id, the secret hash it was derived with, digest).
SaveDigest = Callable[[str, str, str], Awaitable[None]]

DEFAULT_TTL = 5.0
# An expired record whose re-read takes longer than this (Postgres paused or down; one
# indexed read takes ~1 ms) is used as it was, for STALE_RETRY more seconds.
STALE_WAIT = 0.25
STALE_RETRY = 1.0
# Records kept at most: token checks look up ids callers make up, and each unknown one
# is cached too. Past it expired records go, then the oldest.
MAX_RECORDS = 10_000
# nats-server checks the hash on every connect: cost 10 keeps that near 50 ms.
BCRYPT_COST = 10
# Secrets this long or longer get a fast digest: ours are token_urlsafe(32), 43
# characters of 256 random bits. A shorter one (set by hand) stays on bcrypt alone.
DIGEST_MIN_SECRET = 32


def hash_secret(secret: str) -> str:
    return bcrypt.hashpw(secret.encode(), bcrypt.gensalt(BCRYPT_COST)).decode()


def check_secret(secret: str, secret_hash: str) -> bool:
    """Constant-time comparison; a secret bcrypt cannot take (over 72 bytes) or a
    malformed stored hash never matches."""
    try:
        return bcrypt.checkpw(secret.encode(), secret_hash.encode())
    except ValueError:
        return False


def token_digest(secret: str, secret_hash: str) -> str:
    """The fast digest of a secret ("" for one too short to get one): HMAC-SHA256 keyed
    by the secret's bcrypt hash, so a hash changed any way (rotation, SQL by hand) voids
    the digest, and equal secrets of two agents digest differently."""
    if len(secret) < DIGEST_MIN_SECRET:
        return ""
    return hmac.new(secret_hash.encode(), secret.encode(), hashlib.sha256).hexdigest()


def digest_matches(secret: str, secret_hash: str, digest: str) -> bool:
    """Constant-time comparison of a secret's digest with a stored one."""
    return hmac.compare_digest(token_digest(secret, secret_hash).encode(), digest.encode())


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
    """`AgentDirectory` and `TokenVerifier` over a fetch function, with a TTL cache of
    records. A token is checked against its agent's digest (microseconds); an agent
    without one is checked with bcrypt (in a thread, after `before_hashing` allowed
    it), and on success its digest is written (`save_digest`) and used from then on."""

    def __init__(self, fetch: FetchAgent, *, save_digest: SaveDigest | None = None,
                 ttl: float = DEFAULT_TTL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._fetch = fetch
        self._save_digest = save_digest
        self._ttl = ttl
        self._clock = clock
        self._records: dict[str, tuple[float, AgentSecret | None]] = {}

    async def _record(self, agent_id: str) -> AgentSecret | None:
        now = self._clock()
        hit = self._records.get(agent_id)
        if hit is not None and hit[0] > now:
            return hit[1]
        if hit is None:
            record = await self._fetch(agent_id)
        else:
            record = await self._refreshed(agent_id, hit[1])
            if record is hit[1]:  # kept while the database is away; asked again soon
                self._records[agent_id] = (now + STALE_RETRY, record)
                return record
        if len(self._records) >= MAX_RECORDS:
            self._prune(now)
        self._records[agent_id] = (now + self._ttl, record)
        return record

    async def _refreshed(self, agent_id: str, known: AgentSecret | None
                         ) -> AgentSecret | None:
        """The agent's record read again, or `known` when the database does not answer
        within STALE_WAIT or fails: a Postgres pause must not stop admission of the
        agents it knows (a revocation made meanwhile cannot be stored either; the server
        closes a revoked agent's connections itself)."""
        fetching = asyncio.ensure_future(self._fetch(agent_id))
        done, _ = await asyncio.wait({fetching}, timeout=STALE_WAIT)
        if not done:
            fetching.add_done_callback(_ignore_result)
            log.warning("agent %r not re-read within %.2fs: its cached record is kept",
                        agent_id, STALE_WAIT)
            return known
        try:
            return fetching.result()
        except Exception as exc:
            log.warning("agent %r not re-read (%r): its cached record is kept", agent_id, exc)
            return known

    def _prune(self, now: float) -> None:
        self._records = {k: v for k, v in self._records.items() if v[0] > now}
        if len(self._records) >= MAX_RECORDS:
            keep = list(self._records.items())[MAX_RECORDS // 2:]
            self._records = dict(keep)

    def forget(self, agent_id: str) -> None:
        """Drop `agent_id`'s record (its row changed: shared.store.agent_changes): the
        next request reads it again."""
        self._records.pop(agent_id, None)

    def forget_all(self) -> None:
        """Drop every record (changes may have been missed)."""
        self._records.clear()

    async def get(self, agent_id: str) -> AgentInfo | None:
        record = await self._record(agent_id)
        return record.info if record else None

    async def verify_token(self, token: str, *,
                           before_hashing: HashGate | None = None) -> AgentInfo | None:
        """The active agent a bearer token belongs to, or None. `before_hashing` is
        called before bcrypt would be spent (only for an agent without a digest yet) and
        may raise to refuse the check."""
        agent_id, secret = split_token(token)
        record = None
        if secret and not agent_id_problem(agent_id):  # no lookup for a malformed id
            record = await self._record(agent_id)
        if record is None:
            # The same digest work as for a known agent: timing does not tell ids apart.
            digest_matches(secret, "", "")
            return None
        if record.secret_digest:
            ok = digest_matches(secret, record.secret_hash, record.secret_digest)
        else:
            if before_hashing is not None:
                before_hashing()
            ok = await asyncio.to_thread(check_secret, secret, record.secret_hash)
            if ok:
                await self._upgrade(agent_id, record, secret)
        return record.info if ok and not record.info.revoked else None

    async def _upgrade(self, agent_id: str, record: AgentSecret, secret: str) -> None:
        digest = token_digest(secret, record.secret_hash)
        if not digest:
            return
        hit = self._records.get(agent_id)
        if hit is not None and hit[1] is record:
            self._records[agent_id] = (hit[0], msgspec.structs.replace(
                record, secret_digest=digest))
        if self._save_digest is None:
            return
        try:
            await self._save_digest(agent_id, record.secret_hash, digest)
        except Exception as exc:  # the check stands; the next one tries to save again
            log.warning("could not store the token digest of agent %r: %s", agent_id, exc)


def _ignore_result(task: asyncio.Future[AgentSecret | None]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: a late failure is not an unhandled one
