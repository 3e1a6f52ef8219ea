"""The Protocols this service's handlers depend on; adapters implement them, tests pass fakes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from services.gateway.limits.logic import Admission, Limits
from shared.contracts.feedback import Feedback, FeedbackAck
from shared.store.feedback import Recorded


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

    async def admit(self, agent_id: str, request_id: str, *, accepted_at: float,
                    deadline: float, limits: Limits, prices: Mapping[str, list[float]],
                    now: float) -> Admission:
        """Settle the agent's answered requests, then decide on this one (`now`: epoch
        seconds) and, if admitted, count it in flight until its request-log row is
        written or its deadline passes."""
        ...
