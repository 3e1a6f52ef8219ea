"""`agent.request.<agent_id>`: what an agent (a platform backend, an IDE extension, ...)
publishes. The agent is part of the subject, which only that agent's credential may
publish on; the gateway takes the agent from there, never from the payload."""

from __future__ import annotations

import msgspec

from shared.contracts.ids import MAX_ID_CHARS

__all__ = ["MAX_ID_CHARS", "AgentRequest", "agent_of", "request_subject"]

SUBJECT_PREFIX = "agent.request"
# What the AGENT_REQUESTS stream captures and the gateway's consumer reads.
SUBJECTS = f"{SUBJECT_PREFIX}.*"
STREAM = "AGENT_REQUESTS"

# Input bounds checked by the gateway.
MAX_QUERY_CHARS = 8_000
MAX_CONTEXT_CHARS = 32_000


def request_subject(agent_id: str) -> str:
    return f"{SUBJECT_PREFIX}.{agent_id}"


def agent_of(subject: str) -> str:
    """The agent a request subject belongs to ("" if it is not one)."""
    prefix, _, agent = subject.rpartition(".")
    return agent if prefix == SUBJECT_PREFIX else ""


class AgentRequest(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    session_id: str
    # Optional: the agent is the subject's. A body naming another agent is refused
    # (AGENT_MISMATCH).
    agent_id: str = ""
    query: str
    # Caller-declared type (ADR-0008 "Caller-declared type"); trusted agents only.
    query_type: str | None = None
    extra_context: str = ""
    user_info: str = ""
    editor_context: str = ""
    # The caller's time budget in ms (0: the server's REQUEST_DEADLINE); it may only
    # shorten the server's.
    timeout_ms: int = 0
