"""The Protocols this service's handlers depend on; adapters implement them, tests pass fakes.
The per-agent limits' port is `limits.ports.LimitStore`."""

from __future__ import annotations

from typing import Protocol

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
