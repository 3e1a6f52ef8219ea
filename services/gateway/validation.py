"""Input checks for `agent.request`: every bad input maps to one error code."""

from __future__ import annotations

import re

import msgspec

from shared.contracts.request import (
    MAX_CONTEXT_CHARS,
    MAX_ID_CHARS,
    MAX_QUERY_CHARS,
    AgentRequest,
)
from shared.contracts.routing import QueryType


class InputError(msgspec.Struct, frozen=True):
    code: str
    message: str
    # Best-effort id so the error can still be answered on the caller's subject.
    request_id: str = ""


_ID_RE = re.compile(r"^[A-Za-z0-9_\-]+$")
# request_id addresses a response subject, so only safe characters; the others are
# kept as sent, for the request log.
_RAW_FIELD_RE = {
    name: re.compile(rb'"' + name.encode() + rb'"\s*:\s*"(' + chars + rb'{1,128})"')
    for name, chars in (("request_id", rb"[A-Za-z0-9_\-]"), ("session_id", rb'[^"]'),
                        ("agent_id", rb'[^"]'))
}
_REQUIRED = ("request_id", "session_id", "query")
_CONTEXT_FIELDS = ("extra_context", "user_info", "editor_context")
_decoder = msgspec.json.Decoder(AgentRequest)


def salvage_field(raw: bytes, name: str) -> str:
    """An id field (`request_id`, `session_id`, `agent_id`) of a payload that does not
    decode, if one can be seen."""
    match = _RAW_FIELD_RE[name].search(raw[:4096])
    return match.group(1).decode("utf-8", "replace") if match else ""


def salvage_request_id(raw: bytes) -> str:
    return salvage_field(raw, "request_id")


def parse_request(raw: bytes, agent_id: str) -> AgentRequest | InputError:
    """The request `agent_id`'s credential published, checked; its agent is `agent_id`."""
    try:
        req = _decoder.decode(raw)
    except msgspec.ValidationError as exc:
        text = str(exc)
        code = "MISSING_FIELD" if "missing required field" in text.lower() else "INVALID_FIELD"
        return InputError(code, f"request does not match the contract: {text}",
                          salvage_request_id(raw))
    except msgspec.DecodeError as exc:
        return InputError("MALFORMED_JSON", f"request is not valid JSON: {exc}",
                          salvage_request_id(raw))
    return check_request(req, agent_id)


def check_request(req: AgentRequest, agent_id: str) -> AgentRequest | InputError:
    """Every field within bounds and the body's agent (if named) the caller's own."""
    rid = req.request_id if _ID_RE.match(req.request_id or "") else ""
    for name in _REQUIRED:
        if not getattr(req, name).strip():
            return InputError("MISSING_FIELD", f"field '{name}' is required and empty", rid)
    for name in ("request_id", "session_id", "agent_id"):
        value = getattr(req, name)
        if name == "agent_id" and not value:
            continue
        if len(value) > MAX_ID_CHARS:
            return InputError(
                "OVERSIZED_FIELD", f"field '{name}' exceeds {MAX_ID_CHARS} characters", rid
            )
        if not _ID_RE.match(value):
            return InputError(
                "INVALID_FIELD",
                f"field '{name}' may only hold letters, digits, '-' and '_'",
                rid,
            )
    if len(req.query) > MAX_QUERY_CHARS:
        return InputError(
            "OVERSIZED_FIELD", f"field 'query' exceeds {MAX_QUERY_CHARS} characters", rid
        )
    for name in _CONTEXT_FIELDS:
        if len(getattr(req, name)) > MAX_CONTEXT_CHARS:
            return InputError(
                "OVERSIZED_FIELD", f"field '{name}' exceeds {MAX_CONTEXT_CHARS} characters", rid
            )
    if req.query_type is not None and req.query_type != "":
        try:
            QueryType(req.query_type)
        except ValueError:
            allowed = ", ".join(t.value for t in QueryType)
            return InputError(
                "UNKNOWN_QUERY_TYPE",
                f"query_type '{req.query_type}' is not one of: {allowed}",
                rid,
            )
    if req.agent_id and req.agent_id != agent_id:
        return InputError(
            "AGENT_MISMATCH",
            f"the request names agent '{req.agent_id}' but was sent by '{agent_id}'",
            rid,
        )
    return msgspec.structs.replace(req, agent_id=agent_id)
