"""Input checks of what an agent sends, whichever door it came through: a request
(`parse_request`, `check_request`) and a verdict on an answer (`decode_feedback`,
`check_feedback`). Every bad input maps to one error code (an `InvalidInputError`,
returned, never raised: whatever the bytes are, the answer is a value or a typed error).
The gateway checks every request it admits; the doors check what they publish first, so
a caller hears of its mistake before anything is queued."""

from __future__ import annotations

import math
import re

import msgspec

from shared.contracts.errors import InvalidInputError
from shared.contracts.feedback import MAX_QUALITY, Feedback, FeedbackAck
from shared.contracts.ids import id_problem, is_valid_id
from shared.contracts.request import MAX_QUERY_CHARS, AgentRequest, request_problem
from shared.contracts.response import ErrorCode

# request_id addresses a response subject, so only safe characters (and only a valid id
# is used); the others are kept as sent, for the request log.
_RAW_FIELD_RE = {
    name: re.compile(rb'"' + name.encode() + rb'"\s*:\s*"(' + chars + rb'{1,128})"')
    for name, chars in (("request_id", rb"[A-Za-z0-9_\-]"), ("session_id", rb'[^"]'),
                        ("agent_id", rb'[^"]'))
}
_requests = msgspec.json.Decoder(AgentRequest)
_verdicts = msgspec.json.Decoder(Feedback)
_INT4_MAX = 2**31 - 1


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


def parse_request(raw: bytes, agent_id: str) -> AgentRequest | InvalidInputError:
    """The request `agent_id`'s credential published, checked; its agent is `agent_id`."""
    try:
        req = _requests.decode(raw)
    except msgspec.ValidationError as exc:
        return InvalidInputError(validation_code(exc),
                                 f"request does not match the contract: {exc}",
                                 salvage_request_id(raw))
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        # Not JSON, not UTF-8 (msgspec reports bad bytes in a string as a
        # UnicodeDecodeError), or nested past the decoder's depth.
        return InvalidInputError(ErrorCode.MALFORMED_JSON, f"request is not valid JSON: {exc}",
                                 salvage_request_id(raw))
    return check_request(req, agent_id)


def check_request(req: AgentRequest, agent_id: str) -> AgentRequest | InvalidInputError:
    """Every field within bounds (`request_problem`: the rules every stage checks again)
    and the body's agent (if named) the caller's own."""
    rid = req.request_id if is_valid_id(req.request_id) else ""
    problem = request_problem(req)
    if problem is not None:
        return InvalidInputError(problem.code, problem.message, rid)
    if req.agent_id and req.agent_id != agent_id:
        return InvalidInputError(
            ErrorCode.AGENT_MISMATCH,
            f"the request names agent '{req.agent_id}' but was sent by '{agent_id}'",
            rid,
        )
    return msgspec.structs.replace(req, agent_id=agent_id)


def refused(request_id: str, code: str, message: str) -> FeedbackAck:
    """The ack refusing a verdict."""
    return FeedbackAck(request_id=request_id, accepted=False, error_code=code, message=message)


def decode_feedback(raw: bytes) -> Feedback | FeedbackAck:
    """The verdict in `raw`, or the ack that refuses it."""
    try:
        return _verdicts.decode(raw)
    except msgspec.ValidationError as exc:
        return refused(salvage_request_id(raw), validation_code(exc),
                       f"feedback does not match the contract: {exc}")
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        # Not JSON, not UTF-8 (msgspec reports bad bytes in a string as a
        # UnicodeDecodeError), or nested past the decoder's depth.
        return refused(salvage_request_id(raw), ErrorCode.MALFORMED_JSON,
                       f"feedback is not valid JSON: {exc}")


def check_feedback(fb: Feedback) -> FeedbackAck | None:
    """The ack refusing a decoded verdict whose values are out of bounds, or None."""
    problem = id_problem("request_id", fb.request_id)
    if problem:
        code = ErrorCode.MISSING_FIELD if not fb.request_id else ErrorCode.INVALID_FIELD
        return refused("", code, problem)
    meta = fb.metadata
    quality = meta.completion_quality
    if quality is not None and not (math.isfinite(quality) and 0 <= quality <= MAX_QUALITY):
        return refused(fb.request_id, ErrorCode.INVALID_FIELD,
                       f"metadata.completion_quality must be within 0..{MAX_QUALITY:g}")
    if meta.latency_ms is not None and not (math.isfinite(meta.latency_ms)
                                            and meta.latency_ms >= 0):
        return refused(fb.request_id, ErrorCode.INVALID_FIELD,
                       "metadata.latency_ms must be a finite number >= 0")
    if meta.token_count is not None and not 0 <= meta.token_count <= _INT4_MAX:
        return refused(fb.request_id, ErrorCode.INVALID_FIELD,
                       f"metadata.token_count must be within 0..{_INT4_MAX}")
    # A message has fewer parts than characters.
    if fb.part is not None and not 0 <= fb.part < MAX_QUERY_CHARS:
        return refused(fb.request_id, ErrorCode.INVALID_FIELD,
                       f"part must be a part's index, from 0 (below {MAX_QUERY_CHARS})")
    return None
