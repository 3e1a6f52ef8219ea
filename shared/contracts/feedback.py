"""`agent.feedback.<agent_id>`: an agent's verdict on one of its answers (ADR-0006).

The agent is the subject's (only its credential may publish there). The verdict is
acknowledged on `agent.response.<agent_id>._feedback.<request_id>`, which the agent can
read like its answers."""

from __future__ import annotations

import enum

import msgspec

from shared.contracts import response

SUBJECT_PREFIX = "agent.feedback"
SUBJECTS = f"{SUBJECT_PREFIX}.*"
STREAM = "AGENT_FEEDBACK"
# The pseudo request id under which feedback acknowledgements are published
# (request ids cannot start with "_").
ACK_ID = "_feedback"
# The last token of the acknowledgement of a body whose request_id cannot be read.
INVALID_ACK_ID = "_invalid"
# completion_quality is a 0..10 grade.
MAX_QUALITY = 10.0


def feedback_subject(agent_id: str) -> str:
    return f"{SUBJECT_PREFIX}.{agent_id}"


def agent_of(subject: str) -> str:
    """The agent a feedback subject belongs to ("" if it is not one)."""
    prefix, _, agent = subject.rpartition(".")
    return agent if prefix == SUBJECT_PREFIX else ""


def ack_subject(agent_id: str, request_id: str) -> str:
    """`agent.response.<agent_id>._feedback.<request_id>`: inside the agent's responses,
    so it may read (and replay) the acknowledgements of its own feedback only."""
    return f"{response.SUBJECT_PREFIX}.{agent_id}.{ACK_ID}.{request_id}"


class FeedbackOutcome(enum.StrEnum):
    SUCCESS = "success"
    FALLBACK = "fallback"
    TIMEOUT = "timeout"
    ERROR = "error"
    USER_REJECTED = "user_rejected"


class FeedbackSource(enum.StrEnum):
    EXPLICIT = "explicit"  # sent by the agent (NATS, gRPC or HTTP)
    IMPLICIT = "implicit"  # recorded by the pipeline from what it knows


class FeedbackMetadata(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    completion_quality: float | None = None  # 0..10
    latency_ms: float | None = None
    token_count: int | None = None


class Feedback(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    outcome: FeedbackOutcome
    metadata: FeedbackMetadata = FeedbackMetadata()
    # A verdict on one part of a message answered part by part (issue 34): its index,
    # from 0, as its part marker and the final chunk's `parts` number it. None: on the
    # whole request.
    part: int | None = None


class FeedbackAck(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The answer to one feedback message: accepted, or why not (an ErrorCode)."""

    request_id: str
    accepted: bool
    error_code: str = ""
    message: str = ""
    # Accepted, and it replaced an earlier explicit verdict on the same request (a
    # repeat updates, it is never counted twice).
    repeat: bool = False
    # The part the verdict was on (None: the whole request, or a body that did not
    # decode): verdicts on several parts of one request are acked on one subject.
    part: int | None = None
