"""`agent.request.<agent_id>`: what an agent (a platform backend, an IDE extension, ...)
publishes. The agent is part of the subject, which only that agent's credential may
publish on; the gateway takes the agent from there, never from the payload."""

from __future__ import annotations

import unicodedata

import msgspec

from shared.contracts.ids import MAX_ID_CHARS, id_problem
from shared.contracts.response import ErrorCode
from shared.contracts.routing import QueryType

__all__ = ["MAX_ID_CHARS", "AgentRequest", "Problem", "agent_of", "request_problem",
           "request_subject"]

SUBJECT_PREFIX = "agent.request"
# What the AGENT_REQUESTS stream captures and the gateway's consumer reads.
SUBJECTS = f"{SUBJECT_PREFIX}.*"
STREAM = "AGENT_REQUESTS"

# Input bounds checked by the gateway.
MAX_QUERY_CHARS = 8_000
MAX_CONTEXT_CHARS = 32_000
# The largest `timeout_ms` the contract accepts (a day); the gateway then clamps it to
# its REQUEST_DEADLINE. Negative values and larger ones are INVALID_FIELD.
MAX_TIMEOUT_MS = 86_400_000


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
    # A fleet model (`backend/model`) the caller asks for: the first step of its chain
    # when the agent's policy lists it (`models=`); routing and the rest of the agent's
    # chain still apply. "" = the slot's model.
    model: str = ""


class Problem(msgspec.Struct, frozen=True):
    """Why a request cannot be served: its error code and a message for the caller."""

    code: ErrorCode
    message: str


_REQUIRED = ("request_id", "session_id", "query")
# A model name as the request log's column holds it.
MAX_MODEL_CHARS = 128
_IDS = ("request_id", "session_id", "agent_id")
_QUERY_TYPES = tuple(t.value for t in QueryType)
_TEXTS = {"query": MAX_QUERY_CHARS, "extra_context": MAX_CONTEXT_CHARS,
          "user_info": MAX_CONTEXT_CHARS, "editor_context": MAX_CONTEXT_CHARS}


# Characters that show nothing: whitespace, and format (Cf: zero-width spaces and joiners,
# the BOM, bidi marks), control and separator characters.
_INVISIBLE = frozenset(("Cf", "Cc", "Zs", "Zl", "Zp"))


def is_blank(text: str) -> bool:
    """True when `text` shows nothing: empty once whitespace, zero-width and other format
    characters are removed (a query of zero-width spaces or a lone BOM is empty). Stops at
    the first visible character, so a real query costs one or two lookups."""
    return all(ch.isspace() or unicodedata.category(ch) in _INVISIBLE for ch in text)


def request_problem(req: AgentRequest) -> Problem | None:
    """The first rule `req` breaks, None if it breaks none: the gateway refuses such a
    request and every stage checks its envelope's again, so nothing a subject, a column
    or the cascade cannot take travels on. An empty agent_id passes (the gateway fills
    it in from the subject; a stage's envelope always has one, checked with the ids)."""
    for name in _REQUIRED:
        if is_blank(getattr(req, name)):
            return Problem(ErrorCode.MISSING_FIELD, f"field '{name}' is required and empty")
    for name in _IDS:
        value = getattr(req, name)
        if name == "agent_id" and not value:
            continue
        if len(value) > MAX_ID_CHARS:
            return Problem(ErrorCode.OVERSIZED_FIELD,
                           f"field '{name}' exceeds {MAX_ID_CHARS} characters")
        problem = id_problem(name, value)
        if problem:
            return Problem(ErrorCode.INVALID_FIELD, problem)
    for name, limit in _TEXTS.items():
        text = getattr(req, name)
        if len(text) > limit:
            return Problem(ErrorCode.OVERSIZED_FIELD, f"field '{name}' exceeds {limit} characters")
        if "\x00" in text:  # Postgres text cannot hold it: refused before anything is stored
            return Problem(ErrorCode.INVALID_FIELD, f"field '{name}' holds a NUL character")
    if not 0 <= req.timeout_ms <= MAX_TIMEOUT_MS:
        return Problem(ErrorCode.INVALID_FIELD,
                       f"timeout_ms must be 1 to {MAX_TIMEOUT_MS} ms (0: the server's "
                       f"deadline), got {req.timeout_ms}")
    if len(req.model) > MAX_MODEL_CHARS or "\x00" in req.model:
        return Problem(ErrorCode.INVALID_FIELD,
                       f"field 'model' is a backend/model name of at most {MAX_MODEL_CHARS} "
                       "characters")
    if req.query_type and req.query_type not in _QUERY_TYPES:
        allowed = ", ".join(_QUERY_TYPES)
        return Problem(ErrorCode.UNKNOWN_QUERY_TYPE,
                       f"query_type {req.query_type!r} is not one of: {allowed}")
    return None
