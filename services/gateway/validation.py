"""Input checks for `agent.request`: every bad input maps to one error code."""

from __future__ import annotations

import re

import msgspec

from shared.contracts.ids import is_valid_id
from shared.contracts.request import AgentRequest, request_problem
from shared.contracts.response import ErrorCode


class InputError(msgspec.Struct, frozen=True):
    code: str
    message: str
    # Best-effort id so the error can still be answered on the caller's subject.
    request_id: str = ""


# request_id addresses a response subject, so only safe characters (and only a valid id
# is used); the others are kept as sent, for the request log.
_RAW_FIELD_RE = {
    name: re.compile(rb'"' + name.encode() + rb'"\s*:\s*"(' + chars + rb'{1,128})"')
    for name, chars in (("request_id", rb"[A-Za-z0-9_\-]"), ("session_id", rb'[^"]'),
                        ("agent_id", rb'[^"]'))
}
_decoder = msgspec.json.Decoder(AgentRequest)


def salvage_field(raw: bytes, name: str) -> str:
    """An id field (`request_id`, `session_id`, `agent_id`) of a payload that does not
    decode, if one can be seen."""
    # The whole body: a request id may sit anywhere within the size NATS lets through
    # (max_payload, 1 MiB by default); a linear scan of that takes about a millisecond.
    match = _RAW_FIELD_RE[name].search(raw)
    return match.group(1).decode("utf-8", "replace") if match else ""


def salvage_request_id(raw: bytes) -> str:
    """The request id of a payload that does not decode, if it can address an answer."""
    rid = salvage_field(raw, "request_id")
    return rid if is_valid_id(rid) else ""


def validation_code(exc: msgspec.ValidationError) -> ErrorCode:
    """A body that decodes but not into its contract: MISSING_FIELD where msgspec names a
    required field it lacks, else INVALID_FIELD (every door answers the same)."""
    missing = "missing required field" in str(exc).lower()
    return ErrorCode.MISSING_FIELD if missing else ErrorCode.INVALID_FIELD


def parse_request(raw: bytes, agent_id: str) -> AgentRequest | InputError:
    """The request `agent_id`'s credential published, checked; its agent is `agent_id`.
    Never raises: whatever the bytes are, the answer is a request or a typed error."""
    try:
        req = _decoder.decode(raw)
    except msgspec.ValidationError as exc:
        return InputError(validation_code(exc), f"request does not match the contract: {exc}",
                          salvage_request_id(raw))
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        # Not JSON, not UTF-8 (msgspec reports bad bytes in a string as a
        # UnicodeDecodeError), or nested past the decoder's depth.
        return InputError("MALFORMED_JSON", f"request is not valid JSON: {exc}",
                          salvage_request_id(raw))
    return check_request(req, agent_id)


def check_request(req: AgentRequest, agent_id: str) -> AgentRequest | InputError:
    """Every field within bounds (`request_problem`: the rules every stage checks again)
    and the body's agent (if named) the caller's own."""
    rid = req.request_id if is_valid_id(req.request_id) else ""
    problem = request_problem(req)
    if problem is not None:
        return InputError(problem.code, problem.message, rid)
    if req.agent_id and req.agent_id != agent_id:
        return InputError(
            ErrorCode.AGENT_MISMATCH,
            f"the request names agent '{req.agent_id}' but was sent by '{agent_id}'",
            rid,
        )
    return msgspec.structs.replace(req, agent_id=agent_id)
