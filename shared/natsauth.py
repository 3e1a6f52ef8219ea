"""Who may do what on the bus: the permission matrix, as data.

Three kinds of user connect to NATS:
- `admin`: the `intentroute up` process and operator commands; everything (it declares
  the streams).
- one service user per worker type (`intentroute-<worker>`): its stage's durable
  consumer and the subjects its stage hands off to, nothing else. Workers never
  create, update or delete streams.
- one user per active agent: publish its own requests, read its own responses.

Every user may subscribe only to its own reply inbox `_INBOX.<user>.>` (clients pass
`inbox_prefix`), so nobody reads another user's replies or JetStream acks.

The server config (`intentroute.stack.natsconf`) is rendered from this module only.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from shared.contracts import deadletter, feedback, pipeline, request, response
from shared.contracts.routing import ModelSlot
from shared.natsconn import inbox_prefix

ADMIN_USER = "admin"
SERVICE_PREFIX = "intentroute-"

# An agent id is one subject token and a user name: letters, digits, `_`, `-`.
_AGENT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_RESERVED_PREFIX = "intentroute"

# agent.request.<agent_id> (captured by AGENT_REQUESTS) and every agent's response
# subject agent.response.<agent_id>.<request_id>.
AGENT_REQUEST_ANY = request.SUBJECTS
AGENT_RESPONSE_ANY = f"{response.SUBJECT_PREFIX}.*.*"

STREAM_SUBJECTS: dict[str, tuple[str, ...]] = {
    request.STREAM: (AGENT_REQUEST_ANY,),
    pipeline.STREAM: (f"{pipeline.SUBJECT_PREFIX}.>",),
    response.STREAM: (f"{response.SUBJECT_PREFIX}.>",),
    deadletter.STREAM: (f"{deadletter.SUBJECT_PREFIX}.>",),
}


class Permissions(NamedTuple):
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    # Lets a user answer a message it received with a reply subject (the server's
    # flow-control requests on a push consumer), without a publish grant on `$JS.FC`.
    allow_responses: bool = False


class WorkerGrant(NamedTuple):
    """A worker type's durable consumer and what its stage may publish and read."""

    stream: str
    durable: str
    filter_subject: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...] = ()


WORKER_GRANTS: dict[str, WorkerGrant] = {
    # Its gRPC face asks on behalf of authenticated callers: publish any agent's
    # request, follow every response.
    "gateway": WorkerGrant(
        stream=request.STREAM, durable="gateway", filter_subject=AGENT_REQUEST_ANY,
        publish=(pipeline.CLASSIFY_SUBJECT, AGENT_REQUEST_ANY),
        subscribe=(f"{response.SUBJECT_PREFIX}.>",),
    ),
    "classifier": WorkerGrant(
        stream=pipeline.STREAM, durable="classifier", filter_subject=pipeline.CLASSIFY_SUBJECT,
        publish=(pipeline.RETRIEVE_SUBJECT, f"{pipeline.GENERATE_SUBJECT_PREFIX}.*"),
    ),
    "retriever": WorkerGrant(
        stream=pipeline.STREAM, durable="retriever", filter_subject=pipeline.RETRIEVE_SUBJECT,
        publish=(pipeline.generate_subject(ModelSlot.MAIN),
                 pipeline.generate_subject(ModelSlot.CONVERSATIONAL)),
    ),
    "generator-main": WorkerGrant(
        stream=pipeline.STREAM, durable="generator-main",
        filter_subject=pipeline.generate_subject(ModelSlot.MAIN),
        publish=(pipeline.VALIDATE_SUBJECT,),
    ),
    "generator-conversational": WorkerGrant(
        stream=pipeline.STREAM, durable="generator-conversational",
        filter_subject=pipeline.generate_subject(ModelSlot.CONVERSATIONAL),
        publish=(),
    ),
    # RC-08: one trace-guided retry goes back to the main generator.
    "validator": WorkerGrant(
        stream=pipeline.STREAM, durable="validator", filter_subject=pipeline.VALIDATE_SUBJECT,
        publish=(pipeline.generate_subject(ModelSlot.MAIN),),
    ),
}

def agent_id_problem(agent_id: str) -> str:
    """Why `agent_id` cannot name an agent, or "" when it can."""
    if not _AGENT_ID.fullmatch(agent_id):
        return "an agent id is 1 to 64 characters of A-Z, a-z, 0-9, '_' and '-'"
    if agent_id == ADMIN_USER or agent_id.lower().startswith(_RESERVED_PREFIX):
        return f"{agent_id!r} is reserved for the stack's own users"
    return ""


def service_user(worker: str) -> str:
    return f"{SERVICE_PREFIX}{worker}"


SERVICE_USERS: dict[str, str] = {service_user(w): w for w in WORKER_GRANTS}


def consumer_grants(stream: str, durable: str, filter_subject: str) -> tuple[str, ...]:
    """JetStream API subjects for one durable pull consumer: create it (nats-py uses the
    filtered form when the config has a name), look it up, pull, and ack."""
    return (
        f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.{filter_subject}",
        f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
    )


def service_permissions(worker: str) -> Permissions:
    grant = WORKER_GRANTS[worker]
    publish = [
        *consumer_grants(grant.stream, grant.durable, grant.filter_subject),
        # Workers check the streams exist; they never create or change them.
        *(f"$JS.API.STREAM.INFO.{name}" for name in STREAM_SUBJECTS),
        *grant.publish,
        AGENT_RESPONSE_ANY,
        response.INTERNAL_INVALID_SUBJECT,
        # Its own messages that exhausted their deliveries.
        deadletter.dead_letter_subject(grant.durable),
        # The last stored chunk of an answer: resumed after a redelivery, or found final.
        f"$JS.API.STREAM.MSG.GET.{response.STREAM}",
        f"$JS.API.DIRECT.GET.{response.STREAM}.>",
    ]
    subscribe = (*grant.subscribe, f"{inbox_prefix(service_user(worker))}.>")
    return Permissions(publish=_unique(publish), subscribe=subscribe)


def agent_permissions(agent_id: str) -> Permissions:
    """Its own requests and feedback, its own responses (live, or replayed through an
    ephemeral consumer whose filter the server checks against the API subject), its
    own inbox. No stream listing, no other JetStream API."""
    own_responses = response.agent_responses(agent_id)
    publish = [
        request.request_subject(agent_id),
        feedback.feedback_subject(agent_id),
        f"$JS.API.CONSUMER.CREATE.{response.STREAM}.*.{own_responses}",
    ]
    subscribe = [own_responses, f"{inbox_prefix(agent_id)}.>"]
    return Permissions(publish=tuple(publish), subscribe=tuple(subscribe), allow_responses=True)


def _unique(items: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))
