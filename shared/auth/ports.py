"""Who an agent is, as the pipeline needs to know it: the record, its lookup, token checks.
The store (`shared.store.stores`, `shared.store.agents`) implements them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import msgspec

# Called before a token check would spend a slow (bcrypt) hash; raises to refuse it.
HashGate = Callable[[], None]


class AgentInfo(msgspec.Struct, frozen=True):
    """An agent as the pipeline sees it: may it declare types, is it still allowed in."""

    agent_id: str
    trusted: bool = False
    revoked: bool = False


class AgentDirectory(Protocol):
    async def get(self, agent_id: str) -> AgentInfo | None:
        """The agent's record, None if there is no such agent."""


class TokenVerifier(Protocol):
    async def verify_token(self, token: str, *,
                           before_hashing: HashGate | None = None) -> AgentInfo | None:
        """The active agent a bearer token belongs to, or None. `before_hashing` runs
        before any slow hash is spent on the check and may raise to refuse it."""
