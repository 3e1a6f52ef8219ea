"""`agent.response.<agent_id>.<request_id>`: the streamed answer, readable only by the
agent that asked."""

from __future__ import annotations

import enum

import msgspec

from shared.contracts.routing import RoutingDecision

SUBJECT_PREFIX = "agent.response"
STREAM = "AGENT_RESPONSES"
# A malformed request whose request_id cannot be read is answered on its agent's
# `agent.response.<agent_id>._invalid` (request ids cannot start with "_").
INVALID_REQUEST_ID = "_invalid"
# An envelope a stage cannot read has no known caller: it is reported here, for ops.
INTERNAL_INVALID_SUBJECT = "intentroute.invalid"


# One claim per run of a request (`intentroute.claim.<agent>.<request_id>.<run>`): the
# first delivery to store its final chunk there decides the answer; any other delivery of
# that run sends the claimed chunk, byte for byte, or nothing
# (shared.runtime.answer_stream.AnswerStream).
CLAIM_STREAM = "ANSWER_CLAIMS"
CLAIM_SUBJECT_PREFIX = "intentroute.claim"


def claim_subject(agent_id: str, request_id: str, run: str) -> str:
    return f"{CLAIM_SUBJECT_PREFIX}.{agent_id}.{request_id}.{run or '0'}"


def part_handoff_subject(agent_id: str, request_id: str, run: str, part: int) -> str:
    """Where the stage that ends part `part` of a split message stores the next part's
    hand-off before it publishes it (shared.runtime.part_handoffs): a redelivery of that
    part's stages finds it and hands it on again instead of answering the part twice."""
    return f"{claim_subject(agent_id, request_id, run)}.p{part}"


def sent_subject(agent_id: str, request_id: str, run: str) -> str:
    """Where the delivery that stored a run's claimed final chunk says so (the answer
    subject's last message may be another delivery's chunk by then)."""
    return f"{claim_subject(agent_id, request_id, run)}.sent"


def admission_subject(agent_id: str, request_id: str) -> str:
    """The request id's admission claim (beside its runs' claims: a run is digits): the
    run the gateway admitted first under this id. Any later message naming the id —
    sent again, forged, malformed — is answered DUPLICATE_REQUEST on the agent's
    `_invalid` subject, never with a second final on the id's answer subject."""
    return f"{CLAIM_SUBJECT_PREFIX}.{agent_id}.{request_id}.admitted"


def response_subject(agent_id: str, request_id: str) -> str:
    return f"{SUBJECT_PREFIX}.{agent_id}.{request_id}"


def agent_responses(agent_id: str) -> str:
    """Every response subject of one agent (its subscriptions and replays)."""
    return f"{SUBJECT_PREFIX}.{agent_id}.>"


class ChunkKind(enum.StrEnum):
    TEXT = "text"  # a piece of the answer
    STATUS = "status"  # progress note (e.g. "validating code"), not part of the answer
    RESET = "reset"  # a redelivered stage restarts the answer: discard text so far
    CLARIFICATION = "clarification"  # clarity gate policy "ask": options, nothing generated
    # A message carrying several requests is answered part by part: this marker opens a
    # part (`part` says which); its text is the part's heading, so a client that knows
    # no markers still reads each part under its heading. A RESET after it drops only
    # that part's text.
    PART = "part"
    FINAL = "final"


class ValidationStatus(enum.StrEnum):
    """How a CODE_GENERATION answer left the validator (ADR-0009)."""

    VALID = ""
    INVALID_UNRESOLVED = "INVALID_UNRESOLVED"
    PARSER_UNAVAILABLE = "PARSER_UNAVAILABLE"


class ErrorCode(enum.StrEnum):
    """`error.code` of a final error chunk."""

    # Bad input, answered by the gateway.
    MALFORMED_JSON = "MALFORMED_JSON"
    MISSING_FIELD = "MISSING_FIELD"
    INVALID_FIELD = "INVALID_FIELD"
    OVERSIZED_FIELD = "OVERSIZED_FIELD"
    UNKNOWN_QUERY_TYPE = "UNKNOWN_QUERY_TYPE"
    # The request id was admitted already (answered, or in progress): this message is not
    # run, and is answered on the agent's `_invalid` subject (its answer subject keeps
    # its one final chunk).
    DUPLICATE_REQUEST = "DUPLICATE_REQUEST"
    # A stage could not read the envelope it was handed.
    BAD_ENVELOPE = "BAD_ENVELOPE"
    # An envelope without the gateway's admission (not from the pipeline): dropped.
    NOT_ADMITTED = "NOT_ADMITTED"
    # A stage kept failing: answered after its last allowed delivery.
    STAGE_FAILED = "STAGE_FAILED"
    # The request's deadline passed before an answer could be made.
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    # RC-04: a PLATFORM / CONVERSATIONAL request reached the retriever.
    RC04_VIOLATION = "RC04_VIOLATION"
    # The body names another agent than the credential that published it.
    AGENT_MISMATCH = "AGENT_MISMATCH"
    # The publishing agent is unknown or revoked (a request queued before revocation).
    UNKNOWN_AGENT = "UNKNOWN_AGENT"
    # No model of the agent's fallback chain answered and the chain ends in `error`
    # (the agent prefers an explicit error to the extractive answer).
    BACKEND_UNAVAILABLE = "BACKEND_UNAVAILABLE"
    # A model provider's content filter refused the answer (its reason in the message);
    # not retried on another model: the request itself is what it refused.
    CONTENT_FILTERED = "CONTENT_FILTERED"
    # Feedback on a request id the agent never sent (unknown, or another agent's: the
    # two are not told apart, so no agent learns another's request ids).
    UNKNOWN_REQUEST = "UNKNOWN_REQUEST"
    # The store could not be reached for long enough (feedback not recorded: send again).
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
    # Refusals at admission (per-agent limits, services/gateway/limits.py): nothing was
    # worked on; `retry_after_ms` says when asking again can succeed (0: unknown).
    RATE_LIMITED = "RATE_LIMITED"  # requests per second past the agent's bucket
    CONCURRENCY_LIMITED = "CONCURRENCY_LIMITED"  # too many of its requests in flight
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"  # its daily or monthly budget is spent
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"  # its model tokens per minute are used up
    # The doors' own answers (gRPC, HTTP, the OpenAI-compatible door: services/doors),
    # before or beside the pipeline's. A full request stream refused the publish
    # (nothing was queued: ask again shortly).
    QUEUE_FULL = "QUEUE_FULL"
    # NATS failed the publish or the answer's follow (a server paused or restarting).
    BUS_UNAVAILABLE = "BUS_UNAVAILABLE"
    # Too many wrong credentials from this address lately, or the slow check a
    # credential needs is over the door's budget (`retry_after_ms` says when).
    THROTTLED = "THROTTLED"
    # No credential, or not a valid one.
    UNAUTHENTICATED = "UNAUTHENTICATED"
    # A model the request names (`model`: a fleet model, `backend/model`) that its agent
    # may not choose (its policy's `models=`) or the fleet does not serve; the OpenAI
    # door's model names alike (`GET /v1/models/{model}`). Refused before any work.
    UNKNOWN_MODEL = "UNKNOWN_MODEL"
    # The OpenAI door only: a streamed answer restarted (a model failed mid-answer, the
    # next one started again) after part of it was sent; that protocol cannot take sent
    # text back, so the stream ends with this error instead of a second answer after
    # the first. Ask again (or collected: `stream: false` returns only the new answer).
    ANSWER_RESTARTED = "ANSWER_RESTARTED"


class ErrorInfo(msgspec.Struct, frozen=True, omit_defaults=True):
    code: str
    message: str
    # Milliseconds after which the same request may be admitted (refusals; 0: not said).
    retry_after_ms: int = 0


class TokenUsage(msgspec.Struct, frozen=True, omit_defaults=True):
    """The model tokens an answer took, as its backend reported them (the request log's
    counts; 0: none reported, or no model wrote it: the extractive answerer)."""

    tokens_in: int = 0
    tokens_out: int = 0


class CachedFrom(msgspec.Struct, frozen=True, omit_defaults=True):
    """On the final chunk of an answer the cache gave (`answered_by` "cache"): the
    request whose answer it is, and how old that answer is."""

    request_id: str
    age_s: float = 0.0


class PartInfo(msgspec.Struct, frozen=True, omit_defaults=True):
    """A part marker's part: its place (from 0) among `count`, its text, its decision."""

    index: int
    count: int
    text: str
    decision: RoutingDecision | None = None


class PartResult(msgspec.Struct, frozen=True, omit_defaults=True):
    """What one part of a split message got, on the final chunk."""

    index: int
    text: str
    query_type: str = ""
    decision: RoutingDecision | None = None
    validation_status: str = ""
    avap_code: str = ""
    answered_by: str = ""


class ResponseChunk(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    request_id: str
    seq: int
    text: str = ""
    kind: ChunkKind = ChunkKind.TEXT
    is_final: bool = False
    query_type: str = ""
    validation_status: str = ""
    error: ErrorInfo | None = None
    decision: RoutingDecision | None = None
    avap_code: str = ""
    # Who wrote the answer: a fleet model `backend/model`, "extractive" (":budget" when a
    # budget degraded the request), or "cache" (the agent's answer cache gave an earlier
    # answer; `cached_from` says which).
    answered_by: str = ""
    retried: bool = False
    # On an answer's final chunk with ACCOUNTING on: what generating it took (the
    # OpenAI door's `usage`).
    usage: TokenUsage | None = None
    # On the final chunk of an answer served from the agent's answer cache.
    cached_from: CachedFrom | None = None
    # A part marker's part (kind PART); on the final chunk of a split message, every
    # part's decision, validation status and code, in order.
    part: PartInfo | None = None
    parts: list[PartResult] = []
