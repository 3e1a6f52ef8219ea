"""What travels between stages over JetStream: `Admitted` before the classifier has
decided, `Routed` after. A stage that needs a routing decision decodes a `Routed`, whose
decision is required, so no stage checks for a missing one."""

from __future__ import annotations

import re

import msgspec

from shared.contracts.request import AgentRequest, Problem, request_problem
from shared.contracts.response import ErrorCode
from shared.contracts.routing import RETRIEVING_TYPES, ModelSlot, RoutingDecision

STREAM = "INTENTROUTE_PIPELINE"
SUBJECT_PREFIX = "intentroute.stage"
CLASSIFY_SUBJECT = f"{SUBJECT_PREFIX}.classify"
RETRIEVE_SUBJECT = f"{SUBJECT_PREFIX}.retrieve"
GENERATE_SUBJECT_PREFIX = f"{SUBJECT_PREFIX}.generate"
VALIDATE_SUBJECT = f"{SUBJECT_PREFIX}.validate"


def generate_subject(slot: ModelSlot | str) -> str:
    return f"{GENERATE_SUBJECT_PREFIX}.{ModelSlot(slot).value}"


class Passage(msgspec.Struct, frozen=True):
    doc_id: str
    title: str
    text: str
    score: float
    source: str = ""


class UsagePart(msgspec.Struct, array_like=True, frozen=True):
    """One model's share of an answer written by several (continued after a cut, or
    generated again by another model): billed at its own model's price."""

    model: str
    tokens_in: int = 0
    tokens_out: int = 0


class Usage(msgspec.Struct, kw_only=True):
    """What generating the answer took (ADR-0006 accounting), for the request log; set by
    the generator when ACCOUNTING is on, carried to the validator for CODE_GENERATION.
    Tokens and compute time add up over the RC-08 retry."""

    # The model that wrote the answer: an Ollama model name, "extractive", "" if none.
    model: str = ""
    # As the backend reported them (Ollama: prompt_eval_count / eval_count).
    tokens_in: int = 0
    tokens_out: int = 0
    # Why the counts are zero or incomplete ("extractive", "not reported by echo").
    tokens_note: str = ""
    # Milliseconds spent generating, failed steps of the fallback chain included.
    compute_ms: float = 0.0
    # A step after the slot's model answered (or the chain ended in an error), and why
    # the steps before it failed.
    fallback: bool = False
    fallback_reason: str = ""
    # The answer's parts when more than one model wrote it (else empty: `model` wrote
    # it all); `tokens_in` / `tokens_out` are their sums.
    parts: list[UsagePart] = []


class PartPlan(msgspec.Struct, frozen=True, kw_only=True):
    """One request of a split message, as the classifier routed it."""

    text: str
    decision: RoutingDecision
    # An earlier part it points back at ("... that uses it"), -1: none.
    refers_to: int = -1


class PartDone(msgspec.Struct, kw_only=True):
    """A part answered: what the last part's stage puts on the final chunk and in the
    request log (its answer, who wrote it, its validation, its usage)."""

    answer: str = ""
    answered_by: str = ""
    validation_status: str = ""
    avap_code: str = ""
    usage: Usage | None = None


class Admitted(msgspec.Struct, kw_only=True):
    """A request the gateway accepted, on its way to the classifier."""

    request: AgentRequest
    # Epoch seconds when the gateway accepted the request (request-log latency).
    accepted_at: float
    # Per-stage latency in milliseconds, stage name -> ms.
    timings: dict[str, float] = {}
    # The gateway's reading of the agents table: may this agent declare a query_type
    # and use the RC-01 platform prefix?
    trusted: bool = False
    # HMAC of the request's identity and trust under the workers' key (shared.auth.admission).
    admission: str = ""
    # Epoch seconds after which no stage works on the request (0: none).
    deadline: float = 0.0
    # Which run of the request this is: its sequence in AGENT_REQUESTS (a request id the
    # agent used before is a new run), plus `r<id>` per operator replay of a dead letter.
    # Each run has one final chunk (its answer claim, shared.runtime.bus).
    run: str = ""
    # The agent is past its budget and its policy says `on_budget=degrade`: the
    # generator answers with the extractive answerer (no model cost), marked in
    # `answered_by` (services/gateway/limits.py).
    degraded: bool = False


class Routed(msgspec.Struct, kw_only=True):
    """A classified request: everything after the classifier reads and extends this."""

    request: AgentRequest
    accepted_at: float
    decision: RoutingDecision
    passages: list[Passage] = []
    retrieval_query: str = ""
    retrieval_retried: bool = False
    # Generated answer handed to the validator (CODE_GENERATION, RC-07).
    answer: str = ""
    answered_by: str = ""
    # Parser feedback for the one trace-guided retry (RC-08).
    parser_feedback: str = ""
    attempt: int = 0
    # Next free seq on the response subject (a stage that sent status chunks moves it).
    seq: int = 0
    timings: dict[str, float] = {}
    admission: str = ""
    deadline: float = 0.0
    # Accounting of the generation (None: ACCOUNTING off, or not generated yet).
    usage: Usage | None = None
    run: str = ""
    degraded: bool = False
    # A message carrying several requests (issue 34): its parts in order, the one being
    # answered now (`request.query` is its text, `decision` its decision), those
    # answered, and the whole message (the turn the session keeps).
    parts: list[PartPlan] = []
    part: int = 0
    done: list[PartDone] = []
    message: str = ""
    # This part's marker chunk is out (shared.runtime.message_parts.open_part).
    part_opened: bool = False

    @property
    def more_parts(self) -> bool:
        return self.part + 1 < len(self.parts)

    @classmethod
    def from_admitted(cls, admitted: Admitted, decision: RoutingDecision) -> Routed:
        return cls(request=admitted.request, accepted_at=admitted.accepted_at,
                   decision=decision, timings=admitted.timings, deadline=admitted.deadline,
                   run=admitted.run, degraded=admitted.degraded)


def first_subject(decision: RoutingDecision) -> str:
    """Where a decided request goes first: RC-04, only RETRIEVAL and CODE_GENERATION
    through the retriever; the others straight to their slot's generator."""
    if decision.type in RETRIEVING_TYPES:
        return RETRIEVE_SUBJECT
    return generate_subject(decision.model_slot)


# A run: stream sequence digits, and `r<dead-letter id>` per replay.
_RUN = re.compile(r"[0-9r]{0,64}")
# Epoch seconds past any time the pipeline stamps (year 5138): a time beyond it, or
# before 1970, makes every duration computed from it meaningless (or infinite).
MAX_EPOCH = 1e11


def envelope_problem(env: Admitted | Routed) -> Problem | None:
    """What makes an envelope unservable although its caller can be answered: a request
    the gateway would have refused (`request_problem`), or times no clock produced."""
    problem = request_problem(env.request)
    if problem is not None:
        return problem
    for name in ("accepted_at", "deadline"):
        value = getattr(env, name)
        if not 0 <= value <= MAX_EPOCH:
            return Problem(ErrorCode.INVALID_FIELD, f"envelope {name} {value!r} is no time")
    if not _RUN.fullmatch(env.run):  # it becomes a subject token (the answer claim)
        return Problem(ErrorCode.INVALID_FIELD, f"envelope run {env.run[:80]!r} is no run")
    return None


class _Asker(msgspec.Struct):
    agent_id: str = ""


class _Envelope(msgspec.Struct):
    request: _Asker = msgspec.field(default_factory=_Asker)


_decode_asker = msgspec.json.Decoder(_Envelope).decode


def envelope_agent(data: bytes) -> str:
    """The agent a pipeline message (`Admitted` or `Routed`) is for, read without the
    rest of it ("" when it cannot be read: the stage answers such a message itself).
    A stage replica takes its waiting messages in turns by it (shared.runtime.turns)."""
    try:
        return _decode_asker(data).request.agent_id
    except (msgspec.DecodeError, msgspec.ValidationError):
        return ""
