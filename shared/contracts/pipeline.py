"""What travels between stages over JetStream: `Admitted` before the classifier has
decided, `Routed` after. A stage that needs a routing decision decodes a `Routed`, whose
decision is required, so no stage checks for a missing one."""

from __future__ import annotations

import msgspec

from shared.contracts.request import AgentRequest
from shared.contracts.routing import ModelSlot, RoutingDecision

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
    # HMAC of the request's identity and trust under the workers' key (shared.admission).
    admission: str = ""
    # Epoch seconds after which no stage works on the request (0: none).
    deadline: float = 0.0


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

    @classmethod
    def from_admitted(cls, admitted: Admitted, decision: RoutingDecision) -> Routed:
        return cls(request=admitted.request, accepted_at=admitted.accepted_at,
                   decision=decision, timings=admitted.timings, deadline=admitted.deadline)


