"""Wrong credentials per client address, and the doors' slow-hash budget (gRPC, HTTP
feedback, the OpenAI-compatible door, the dashboard).

Checking a credential is cheap: an agent token against its fast digest (~3 us,
shared.auth.identity), the dashboard token by constant-time comparison. So every
credential presented is checked, from any address, and a right one is let in even from
an address that presented many wrong ones (everyone behind one proxy or NAT shares its
address). Wrong ones are counted per address: past `limit` within the window (a
`limits` rate string, "20/minute"), the address's wrong credentials are answered
HTTP 429 / gRPC RESOURCE_EXHAUSTED with the seconds to wait, not 401, until the window
moves on. Guessing is not what this stops: secrets are 256 random bits.

bcrypt (~60 ms of CPU) is left only for agents whose digest is not written yet (added
before it existed, until their first right token). It is never spent for a throttled
address, and all addresses together get `hashes` checks per window ("8/second"): an
attacker rotating addresses gains no more CPU than one that does not. Past that, such a
token is refused unchecked (retry in a second), the right one too; the first right one
writes the digest and ends it for that agent.

Addresses are as the doors see them. Each replica counts its own (memory).
"""

from __future__ import annotations

import logging
import math
import time

import limits
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter, SlidingWindowCounterRateLimiter

from services.doors.log_budget import LogBudget
from shared.auth.ports import AgentInfo, TokenVerifier
from shared.contracts.errors import RetryableError
from shared.contracts.response import ErrorCode

log = logging.getLogger("intentroute.doors.throttle")

DEFAULT_AUTH_FAILURES = "20/minute"
# bcrypt cost 10 took 63 ms of one core here (2 cores): 8 a second is half a core at
# most, whatever the number of addresses.
DEFAULT_AUTH_HASHES = "8/second"
# KiB of chat bodies one agent may have the OpenAI door read and parse a second: twice
# the largest body (2 MiB). Reading and converting a 2 MB body took the door's loop
# 10-15 ms here (50-65 ms under load); unbounded, six loops of such bodies from one
# agent (~18 a second) raised another agent's p50 from 0.54 to 1.01 s.
DEFAULT_BODY_RATE = "4096/second"
_HASHES = "bcrypt"


class ThrottledError(RetryableError):
    """Refused: this address presented too many wrong credentials lately, or the slow
    check it needs is over the doors' budget; `retry_after`: whole seconds to wait."""

    code = ErrorCode.THROTTLED

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message, retry_after_ms=retry_after * 1000)
        self.retry_after = retry_after


def _rule(limit: str, setting: str, example: str) -> limits.RateLimitItem | None:
    if not limit:
        return None
    try:
        return limits.parse(limit)
    except ValueError:
        raise ValueError(f"{setting} {limit!r} is not a rate such as {example!r} "
                         f"(or 'off')") from None


class AuthThrottle:
    def __init__(self, limit: str, hashes: str = DEFAULT_AUTH_HASHES) -> None:
        """`limit`: wrong credentials per address, e.g. "20/minute"; `hashes`: bcrypt
        checks per window over all addresses, e.g. "8/second"; "" turns either off."""
        self._failures = _rule(limit, "GATEWAY_AUTH_FAILURES", DEFAULT_AUTH_FAILURES)
        self._hashes = _rule(hashes, "GATEWAY_AUTH_HASHES", DEFAULT_AUTH_HASHES)
        self._limiter = MovingWindowRateLimiter(MemoryStorage())
        self._log = LogBudget(log)

    def _retry_after(self, item: limits.RateLimitItem, key: str) -> int:
        reset = self._limiter.get_window_stats(item, key).reset_time
        return max(1, math.ceil(reset - time.time()))

    def throttled(self, client: str) -> bool:
        """Has `client` used up its wrong credentials for now?"""
        return self._failures is not None and not self._limiter.test(self._failures, client)

    def failed(self, client: str) -> None:
        """Count a wrong credential from `client`; ThrottledError once it is past its
        limit (this one included), so the caller answers 429, not 401."""
        if self._failures is None or self._limiter.hit(self._failures, client):
            return
        retry_after = self._retry_after(self._failures, client)
        self._log.warning(client, "throttling wrong credentials from %s (over %s)",
                          client, self._failures)
        raise ThrottledError(f"too many wrong credentials from {client}; "
                             f"retry in {retry_after} s", retry_after)

    def before_hashing(self, client: str) -> None:
        """ThrottledError unless a bcrypt check for `client` may be spent: the address
        is not throttled and the doors' budget has room."""
        if self.throttled(client):
            assert self._failures is not None
            retry_after = self._retry_after(self._failures, client)
            raise ThrottledError(f"too many wrong credentials from {client}; "
                                 f"retry in {retry_after} s", retry_after)
        if self._hashes is not None and not self._limiter.hit(self._hashes, _HASHES):
            self._log.warning(_HASHES, "slow credential checks over %s: refused unchecked",
                              self._hashes)
            retry_after = self._retry_after(self._hashes, _HASHES)
            raise ThrottledError(f"too many credential checks; retry in {retry_after} s",
                                 retry_after)

    async def verify(self, agents: TokenVerifier, token: str, client: str) -> AgentInfo | None:
        """The token's agent; None: no token or a wrong one (counted against `client`);
        ThrottledError for a wrong one past the limit, or a check the hashing budget
        refuses. A right token is never refused for others' failures."""
        if not token:
            return None
        agent = await agents.verify_token(
            token, before_hashing=lambda: self.before_hashing(client))
        if agent is None:
            self.failed(client)
        return agent


def grpc_peer_address(peer: str) -> str:
    """`ipv4:10.0.0.1:5000` / `ipv6:[::1]:5000` -> the address without its port."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rpartition(":")[0].strip("[]") or rest
    return peer


class BodyBudget:
    """The OpenAI door's per-agent budget of request bytes read and parsed, checked on
    the body's declared length before it is read (a body with none is charged once
    read, before it is parsed): one agent's large bodies cannot take the door's loop
    from the others. A sliding-window counter (`limits`), kept per replica."""

    def __init__(self, rate: str = DEFAULT_BODY_RATE) -> None:
        self._item = _rule(rate, "GATEWAY_DOOR_BODY_RATE", DEFAULT_BODY_RATE)
        self._limiter = SlidingWindowCounterRateLimiter(MemoryStorage())

    def spend(self, agent_id: str, size: int) -> int:
        """0 when `agent_id` may have `size` more bytes parsed now; else the whole
        seconds to wait (nothing is spent)."""
        if self._item is None:
            return 0
        cost = max(1, math.ceil(size / 1024))
        if self._limiter.hit(self._item, agent_id, cost=cost):
            return 0
        reset = self._limiter.get_window_stats(self._item, agent_id).reset_time
        return max(1, math.ceil(reset - time.time()))
