"""`agent.request`: what a platform backend publishes."""

from __future__ import annotations

import msgspec

SUBJECT = "agent.request"
STREAM = "AGENT_REQUESTS"

# Input bounds checked by the gateway.
MAX_QUERY_CHARS = 8_000
MAX_CONTEXT_CHARS = 32_000
MAX_ID_CHARS = 128


class AgentRequest(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    session_id: str
    agent_id: str
    query: str
    # Caller-declared type (ADR-0008 "Caller-declared type"); trusted callers only.
    query_type: str | None = None
    extra_context: str = ""
    user_info: str = ""
    editor_context: str = ""
