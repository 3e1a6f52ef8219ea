"""The per-agent policy lookup a stage's logic depends on (`shared.store.policy_cache`
implements it)."""

from __future__ import annotations

from typing import Protocol

from shared.policy.agent import AgentPolicy


class Policies(Protocol):
    """Per-agent policies (`shared.policy_cache.PolicyCache`): a lookup, no I/O."""

    def policy_for(self, agent_id: str, request_id: str = "") -> AgentPolicy:
        """The agent's policy for this request (the empty policy: global defaults)."""
