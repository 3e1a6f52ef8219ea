"""The Protocols this service's handlers depend on; adapters implement them, tests pass fakes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from services.gateway.limits.logic import Ask, Grant, Held, Limits
from shared.contracts.feedback import Feedback, FeedbackAck
from shared.store.feedback_table import Recorded


class FeedbackStore(Protocol):
    async def record_explicit(self, agent_id: str, feedback: Feedback) -> Recorded:
        """Store the verdict if the request is in the agent's request log."""


class VerdictRecorder(Protocol):
    """Checks and stores one agent's verdict on one of its answers, for every entry point
    (`feedback.FeedbackRecorder`)."""

    async def record(self, agent_id: str, fb: Feedback) -> FeedbackAck:
        """The ack of `agent_id`'s verdict; StoreUnavailableError if the database cannot
        be reached."""
        ...


class LimitStore(Protocol):
    """The per-agent limits' state shared by every gateway replica
    (`limits.store.PgLimits`)."""

    async def lease(self, agent_id: str, *, replica: str, seq: int, asks: Sequence[Ask],
                    held: Sequence[Held], keep: int, want: int, ttl: float, share: int,
                    limits: Limits, prices: Mapping[str, list[float]], now: float) -> Grant:
        """Record `held` (admitted on `replica`'s allowance) in flight, settle the
        agent's answered requests, decide each of `asks` in order (`now`: epoch seconds;
        an admitted one counts in flight until its request-log row is written or its
        deadline passes), and grant the replica at most `want` more admissions beside
        the `keep` it still holds, for `ttl` seconds, each within 1/`share` of every
        limit's room (`seq`: the replica's call number; a late call grants nothing)."""
        ...
