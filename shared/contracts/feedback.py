"""`agent.feedback.<agent_id>`: an agent's verdict on one of its answers (ADR-0006)."""

from __future__ import annotations

SUBJECT_PREFIX = "agent.feedback"


def feedback_subject(agent_id: str) -> str:
    return f"{SUBJECT_PREFIX}.{agent_id}"
