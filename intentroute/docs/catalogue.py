"""What travels on which subject, as data: the messages (a msgspec contract, or a schema
for the few payloads that are not JSON structs), their headers, and the channels built
from the contracts' subject functions. `intentroute.docs.asyncapi` renders it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shared.auth.permissions import FEEDBACK_DURABLE, WORKER_GRANTS
from shared.contracts import deadletter, feedback, pipeline, replay, request, response, turn_rows
from shared.contracts.feedback import Feedback, FeedbackAck
from shared.contracts.ids import MAX_ID_CHARS
from shared.contracts.pipeline import Admitted, Routed
from shared.contracts.request import AgentRequest
from shared.contracts.response import ResponseChunk
from shared.contracts.routing import ModelSlot
from shared.runtime.row_queue import QueuedRows

JSON = "application/json"


@dataclass(frozen=True)
class Header:
    name: str
    description: str
    required: bool = False
    pattern: str = ""


@dataclass(frozen=True)
class Message:
    """One kind of message: `payload` is its msgspec contract, or None when `schema`
    (a JSON Schema) describes a payload that is no JSON struct."""

    name: str
    title: str
    summary: str
    payload: type | None = None
    schema: dict[str, Any] = field(default_factory=dict)
    content_type: str = JSON
    headers: tuple[Header, ...] = ()
    internal: bool = False


@dataclass(frozen=True)
class Channel:
    key: str
    # The subject with `{parameter}` tokens; None: a reply inbox the requester chooses.
    address: str | None
    messages: tuple[str, ...]
    description: str
    parameters: tuple[str, ...] = ()
    # The JetStream stream that stores it ("" : core NATS, not stored).
    stream: str = ""
    durable: str = ""
    internal: bool = False


# Headers ------------------------------------------------------------------------------

TRACEPARENT = Header(
    "traceparent",
    "W3C trace context (optional). The gateway continues the caller's trace; every stage "
    "hands it on, so one request is one trace across the workers.",
    pattern="^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
TRACESTATE = Header("tracestate", "W3C trace state, handed on with `traceparent` (optional).")
REQUEST_MSG_ID = Header(
    "Nats-Msg-Id",
    "JetStream deduplication key (recommended): a resend with the same id within the "
    "stream's duplicate window (120 s) is stored once. AGENT_REQUESTS deduplicates across "
    "every agent's subject, so make it unpredictable: the Python client sends "
    "`<agent_id>:<request_id>:<32 random hex digits>` and reuses it only to resend.")
FINAL_MSG_ID = Header(
    "Nats-Msg-Id",
    "On the final chunk only: `<agent_id>:<request_id>:final:<run>` (the stream stores one "
    "final chunk per run of a request).")
STAGE_MSG_ID = Header(
    "Nats-Msg-Id", "`<agent_id>:<request_id>:<run>:<step>`: a re-publish after a crash is a "
    "no-op; a request id asked again is a new run.",
    required=True)
ROWS_MSG_ID = Header("Nats-Msg-Id", "`rows:<blake2b-128 of the payload, hex>`.", required=True)
DEAD_LETTER_HEADERS = (
    Header(deadletter.STAGE_HEADER, "The stage that gave up on the message.", required=True),
    Header(deadletter.REASON_HEADER, "Why (at most 1000 characters).", required=True),
    Header(deadletter.SUBJECT_HEADER, "The subject the message was on.", required=True),
    Header(deadletter.DELIVERIES_HEADER, "How many times it was delivered (decimal).",
           required=True, pattern="^[0-9]+$"),
    Header("traceparent", "The original message's trace context, when it had one."),
)

# Messages -----------------------------------------------------------------------------

_ID_SCHEMA: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS,
                              "pattern": "^[A-Za-z0-9_-]+$"}

MESSAGES: tuple[Message, ...] = (
    Message("AgentRequest", "Agent request",
            "A question. Published with JetStream on the agent's own request subject: the "
            "publish ack is the stream's receipt, not the answer (subscribe to the response "
            "subject first). `agent_id` may be left out: the agent is the subject's. "
            "`timeout_ms` may only shorten the server's deadline (`REQUEST_DEADLINE`); past "
            "it the answer is a final `DEADLINE_EXCEEDED` error.",
            payload=AgentRequest, headers=(REQUEST_MSG_ID, TRACEPARENT, TRACESTATE)),
    Message("ResponseChunk", "Response chunk",
            "One piece of a streamed answer, in `seq` order; the last one has `is_final` "
            "and carries `query_type`, `decision`, `validation_status`, `answered_by`, or "
            "`error` (every request ends in exactly one final chunk); an answer the agent's "
            "answer cache gave (`answered_by` `cache`) also carries `cached_from`. A "
            "`reset` chunk means a stage restarted the answer: drop the text received so "
            "far.",
            payload=ResponseChunk, headers=(FINAL_MSG_ID, TRACEPARENT)),
    Message("Feedback", "Feedback",
            "The agent's verdict on one of its answers (ADR-0006); a repeat for the same "
            "request id updates it.", payload=Feedback, headers=(TRACEPARENT,)),
    Message("FeedbackAck", "Feedback acknowledgement",
            "The gateway's answer to one feedback message: accepted (`repeat`: it replaced "
            "an earlier verdict), or refused with an error code.", payload=FeedbackAck),
    Message("ReplayRequest", "Replay request",
            "A late reader's request for a stored answer: the request id as UTF-8 text, "
            "nothing else, with the caller's inbox as the reply subject.",
            schema={**_ID_SCHEMA, "title": "ReplayRequest",
                    "description": "A request id (UTF-8 text, not JSON)."},
            content_type="text/plain"),
    Message("Admitted", "Admitted request",
            "Internal: a request the gateway accepted, on its way to the classifier "
            "(sealed with the gateway's admission HMAC).",
            payload=Admitted, headers=(STAGE_MSG_ID, TRACEPARENT), internal=True),
    Message("Routed", "Routed request",
            "Internal: a classified request; every stage after the classifier reads and "
            "extends it.", payload=Routed, headers=(STAGE_MSG_ID, TRACEPARENT), internal=True),
    Message("AnswerClaim", "Answer claim",
            "Internal: the one final chunk of a run, stored before it is sent: 32 bytes of "
            "HMAC-SHA256 under the workers' key, then the ResponseChunk's JSON.",
            schema={"title": "AnswerClaim", "type": "string",
                    "contentMediaType": "application/octet-stream",
                    "description": "HMAC-SHA256 (32 bytes) + ResponseChunk JSON."},
            content_type="application/octet-stream", internal=True),
    Message("DeadLetter", "Dead letter",
            "Internal: a message that exhausted its deliveries, its bytes unchanged "
            "(usually an AgentRequest, Feedback, Admitted, Routed or QueuedRows; a poison "
            "message may be anything), with why in its headers.",
            schema={"title": "DeadLetter",
                    "description": "The original message's bytes, unchanged."},
            content_type="application/octet-stream", headers=DEAD_LETTER_HEADERS,
            internal=True),
    Message("QueuedRows", "Queued turn rows",
            "Internal: a turn's rows that Postgres did not take in time, waiting for the "
            "row writer.", payload=QueuedRows, headers=(ROWS_MSG_ID,), internal=True),
)

# Channels -----------------------------------------------------------------------------

# Every durable consumer that may dead-letter (the gateway's per-agent consumers are
# `gateway-<agent_id>`).
DURABLES = tuple(sorted({*(g.durable for g in WORKER_GRANTS.values()), FEEDBACK_DURABLE,
                         turn_rows.DURABLE}))

PARAMETERS: dict[str, dict[str, Any]] = {
    "agentId": {"description": "The agent's id: its credential's user (1 to 64 of A-Z, a-z, "
                               "0-9, `_`, `-`). Taken from the subject, never the payload."},
    "requestId": {"description": f"The request's id (1 to {MAX_ID_CHARS} of A-Z, a-z, 0-9, "
                                 "`_`, `-`; not `_invalid`)."},
    "sessionId": {"description": "The session's id (`_` for one that cannot be a token)."},
    "run": {"description": "Which run of the request: its AGENT_REQUESTS sequence, plus "
                           "`r<id>` per operator replay of a dead letter (`0`: none)."},
    "slot": {"description": "The model slot.", "enum": [s.value for s in ModelSlot]},
    "durable": {"description": "The durable consumer that gave up: "
                               + ", ".join(f"`{d}`" for d in DURABLES)
                               + ", or `gateway-<agent_id>`."},
}

A, R = "{agentId}", "{requestId}"

CHANNELS: tuple[Channel, ...] = (
    Channel("agentRequest", request.request_subject(A), ("AgentRequest",),
            "The agent's questions. Only that agent's credential may publish here; the "
            "gateway reads them (one consumer per agent, taken in fair turns).",
            ("agentId",), stream=request.STREAM, durable="gateway-<agent_id>"),
    Channel("agentResponse", response.response_subject(A, R), ("ResponseChunk",),
            "The answer to one request, chunk by chunk. Readable by that agent only; "
            "stored (TTL `RESPONSE_TTL`), so a reader that subscribes late may ask for a "
            "replay.", ("agentId", "requestId"), stream=response.STREAM),
    Channel("agentResponseInvalid", response.response_subject(A, response.INVALID_REQUEST_ID),
            ("ResponseChunk",),
            "A final error chunk for input whose request id could not be read.",
            ("agentId",), stream=response.STREAM),
    Channel("agentFeedback", feedback.feedback_subject(A), ("Feedback",),
            "The agent's verdicts on its answers, read by the gateway.",
            ("agentId",), stream=feedback.STREAM, durable=FEEDBACK_DURABLE),
    Channel("agentFeedbackAck", feedback.ack_subject(A, R), ("FeedbackAck",),
            "The acknowledgement of one feedback message (`_invalid` in place of the "
            "request id when the body's could not be read).",
            ("agentId", "requestId"), stream=response.STREAM),
    Channel("agentReplay", replay.replay_subject(A), ("ReplayRequest",),
            "Late replay: a core NATS request (not stored), answered by the gateway (queue "
            f"group `{replay.QUEUE}`) on the reply inbox.", ("agentId",)),
    Channel("agentReplayReply", None, ("ResponseChunk",),
            "The requester's inbox (`_INBOX.<agent_id>.>`): the stored chunks of the "
            "answer, byte for byte as they were sent live, to its final chunk; one final "
            "`UNKNOWN_REQUEST` chunk when nothing is stored under the request id."),
    Channel("stageClassify", pipeline.CLASSIFY_SUBJECT, ("Admitted",),
            "Gateway to classifier.", stream=pipeline.STREAM, durable="classifier",
            internal=True),
    Channel("stageRetrieve", pipeline.RETRIEVE_SUBJECT, ("Routed",),
            "Classifier to retriever (RETRIEVAL and CODE_GENERATION only: RC-04).",
            stream=pipeline.STREAM, durable="retriever", internal=True),
    Channel("stageGenerate", f"{pipeline.GENERATE_SUBJECT_PREFIX}.{{slot}}", ("Routed",),
            "To the generator of one model slot (durable `generator-<slot>`): from the "
            "retriever, the classifier (conversational) or the validator's retry.",
            ("slot",), stream=pipeline.STREAM, durable="generator-<slot>", internal=True),
    Channel("stageValidate", pipeline.VALIDATE_SUBJECT, ("Routed",),
            "Generator (CODE_GENERATION) to validator.", stream=pipeline.STREAM,
            durable="validator", internal=True),
    Channel("answerClaim", response.claim_subject(A, R, "{run}"), ("AnswerClaim",),
            "The one final chunk of a run, claimed before it is sent (workers only).",
            ("agentId", "requestId", "run"), stream=response.CLAIM_STREAM, internal=True),
    Channel("invalidEnvelope", response.INTERNAL_INVALID_SUBJECT, ("ResponseChunk",),
            "An envelope a stage could not read or that lacked the gateway's admission, "
            "reported as an error chunk for ops (core NATS, not stored).", internal=True),
    Channel("deadLetter", deadletter.dead_letter_subject("{durable}"), ("DeadLetter",),
            "Messages after their last delivery, kept a week for an operator "
            "(`intentroute dlq list / replay`).", ("durable",), stream=deadletter.STREAM,
            internal=True),
    Channel("turnRows", turn_rows.rows_subject(A, "{sessionId}"), ("QueuedRows",),
            "Turn rows waiting for Postgres, written in order by every worker's row "
            "writer.", ("agentId", "sessionId"), stream=turn_rows.STREAM,
            durable=turn_rows.DURABLE, internal=True),
)


@dataclass(frozen=True)
class Operation:
    """One of the agent's operations: what it sends or receives, on which channel."""

    key: str
    action: str
    channel: str
    summary: str
    reply_channel: str = ""


OPERATIONS: tuple[Operation, ...] = (
    Operation("sendRequest", "send", "agentRequest",
              "Ask: subscribe to agentResponse first, then publish with JetStream."),
    Operation("receiveAnswer", "receive", "agentResponse",
              "Read the answer's chunks to the first final one."),
    Operation("receiveInvalidRequestAnswer", "receive", "agentResponseInvalid",
              "Read the error answer to input without a readable request id."),
    Operation("sendFeedback", "send", "agentFeedback",
              "Grade an answer: subscribe to agentFeedbackAck first, then publish."),
    Operation("receiveFeedbackAck", "receive", "agentFeedbackAck",
              "Read whether the feedback was accepted."),
    Operation("requestReplay", "send", "agentReplay",
              "Ask for a stored answer (after subscribing late or a reconnect).",
              reply_channel="agentReplayReply"),
)
