"""Failed credential checks per client address (gRPC, HTTP feedback, the dashboard).

An agent token is checked with bcrypt (~50 ms of CPU, on purpose), so a stream of wrong
tokens from anyone who can reach the gateway would eat its CPU and the threads that
answer real agents; the dashboard's token could be guessed at. Past `limit` failed
checks from one address within the window (a `limits` rate string, "20/minute"), that
address's credentials are refused, not checked, until the window moves on: HTTP 429 /
gRPC RESOURCE_EXHAUSTED with the seconds to wait. Valid credentials never count.

Addresses are as the gateway sees them: behind a proxy, every caller shares the proxy's.
Each gateway replica counts its own failures (memory).
"""

from __future__ import annotations

import logging
import math
import time

import limits
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

from shared.auth.ports import AgentInfo, TokenVerifier

log = logging.getLogger("intentroute.gateway.throttle")

DEFAULT_AUTH_FAILURES = "20/minute"


class ThrottledError(Exception):
    """Too many failed credential checks from this address: refused unchecked."""

    def __init__(self, client: str, retry_after: int) -> None:
        super().__init__(f"too many failed credentials from {client}; retry in {retry_after} s")
        self.retry_after = retry_after


class AuthThrottle:
    def __init__(self, limit: str) -> None:
        """`limit`: e.g. "20/minute"; "" turns the throttle off."""
        # The rate and its moving-window counter; None: off.
        self._rule: tuple[limits.RateLimitItem, MovingWindowRateLimiter] | None = None
        if limit:
            try:
                item = limits.parse(limit)
            except ValueError:
                raise ValueError(f"GATEWAY_AUTH_FAILURES {limit!r} is not a rate such as "
                                 f"{DEFAULT_AUTH_FAILURES!r} (or 'off')") from None
            self._rule = (item, MovingWindowRateLimiter(MemoryStorage()))

    def check(self, client: str) -> None:
        """ThrottledError if `client` has used up its failed checks."""
        if self._rule is None:
            return
        item, limiter = self._rule
        if not limiter.test(item, client):
            reset = limiter.get_window_stats(item, client).reset_time
            raise ThrottledError(client, max(1, math.ceil(reset - time.time())))

    def failed(self, client: str) -> None:
        if self._rule is None:
            return
        item, limiter = self._rule
        if not limiter.hit(item, client):
            log.warning("throttling credential checks from %s (over %s failures)",
                        client, item)

    async def verify(self, agents: TokenVerifier, token: str, client: str) -> AgentInfo | None:
        """The token's agent (None: no token or not a valid one, counted as a failure);
        ThrottledError, without checking, once `client` failed too often."""
        if not token:
            return None
        self.check(client)
        agent = await agents.verify_token(token)
        if agent is None:
            self.failed(client)
        return agent


def grpc_peer_address(peer: str) -> str:
    """`ipv4:10.0.0.1:5000` / `ipv6:[::1]:5000` -> the address without its port."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rpartition(":")[0].strip("[]") or rest
    return peer
