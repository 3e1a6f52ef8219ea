"""Who may do what on the bus: the permission matrix, as data.

Four kinds of user connect to NATS:
- `admin`: the `intentroute up` process and operator commands; everything (it declares
  the streams).
- one service user per worker type (`intentroute-<worker>`): its stage's durable
  consumer and the subjects its stage hands off to, nothing else. Workers never
  create, update or delete streams. Each answers the services API (`$SRV.PING / INFO
  / STATS`) under its own name only: it subscribes to the control subjects of every
  service and of its name, and replies to each request once (`allow_responses`)
  without any publish grant on another user's inbox.
- `intentroute-ops`: the monitoring reader (`intentroute status`, a scraper's sidecar):
  services-API requests, consumer and stream info; it cannot publish work, pull, ack,
  nor change a stream or consumer, so a monitoring host never holds the admin's power.
- one user per active agent: publish its own requests and feedback, read its own
  responses (feedback acknowledgements included).

Every user may subscribe only to its own reply inbox `_INBOX.<user>.>` (clients pass
`inbox_prefix`), so nobody reads another user's replies or JetStream acks.

The server config (`intentroute.stack.natsconf`) is rendered from this module only.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from shared.auth.natsconn import inbox_prefix
from shared.contracts import deadletter, feedback, pipeline, request, response
from shared.contracts.routing import ModelSlot

ADMIN_USER = "admin"
SERVICE_PREFIX = "intentroute-"
OPS_USER = f"{SERVICE_PREFIX}ops"
# The NATS services API's control subjects (nats.micro): `$SRV.<VERB>` (every service),
# `$SRV.<VERB>.<name>` (every instance of one), `$SRV.<VERB>.<name>.<id>` (one instance).
SERVICES_API = "$SRV"
SERVICES_VERBS = ("PING", "INFO", "STATS")

# An agent id is one subject token and a user name: letters, digits, `_`, `-`.
_AGENT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_RESERVED_PREFIX = "intentroute"

# agent.request.<agent_id> (captured by AGENT_REQUESTS) and every agent's response
# subject agent.response.<agent_id>.<request_id>.
AGENT_REQUEST_ANY = request.SUBJECTS
AGENT_RESPONSE_ANY = f"{response.SUBJECT_PREFIX}.*.*"

# agent.feedback.<agent_id> (captured by AGENT_FEEDBACK) and the acknowledgements on
# agent.response.<agent_id>._feedback.<request_id>.
AGENT_FEEDBACK_ANY = feedback.SUBJECTS
FEEDBACK_ACK_ANY = feedback.ack_subject("*", "*")
# The gateway's durable consumer of AGENT_FEEDBACK.
FEEDBACK_DURABLE = "gateway-feedback"

STREAM_SUBJECTS: dict[str, tuple[str, ...]] = {
    request.STREAM: (AGENT_REQUEST_ANY,),
    feedback.STREAM: (AGENT_FEEDBACK_ANY,),
    pipeline.STREAM: (f"{pipeline.SUBJECT_PREFIX}.>",),
    response.STREAM: (f"{response.SUBJECT_PREFIX}.>",),
    response.CLAIM_STREAM: (f"{response.CLAIM_SUBJECT_PREFIX}.>",),
    deadletter.STREAM: (f"{deadletter.SUBJECT_PREFIX}.>",),
}


class Permissions(NamedTuple):
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    # Lets a user answer a message it received with a reply subject (the server's
    # flow-control requests on a push consumer), without a publish grant on `$JS.FC`.
    allow_responses: bool = False


class ConsumerGrant(NamedTuple):
    """One more durable consumer a worker reads besides its stage's."""

    stream: str
    durable: str
    filter_subject: str


class WorkerGrant(NamedTuple):
    """A worker type's durable consumer and what its stage may publish and read."""

    stream: str
    durable: str
    filter_subject: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...] = ()
    # Further durable consumers of the same worker (the gateway's feedback consumer).
    consumers: tuple[ConsumerGrant, ...] = ()


WORKER_GRANTS: dict[str, WorkerGrant] = {
    # Its gRPC face asks on behalf of authenticated callers: publish any agent's
    # request, follow every response. It also reads every agent's feedback and
    # acknowledges it on that agent's responses.
    "gateway": WorkerGrant(
        stream=request.STREAM, durable="gateway", filter_subject=AGENT_REQUEST_ANY,
        publish=(pipeline.CLASSIFY_SUBJECT, AGENT_REQUEST_ANY, FEEDBACK_ACK_ANY),
        subscribe=(f"{response.SUBJECT_PREFIX}.>",),
        consumers=(ConsumerGrant(feedback.STREAM, FEEDBACK_DURABLE, AGENT_FEEDBACK_ANY),),
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
# Every user of the stack that is not an agent (credentials written by `intentroute up`).
STACK_USERS: tuple[str, ...] = (ADMIN_USER, OPS_USER, *SERVICE_USERS)


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
        *(p for c in grant.consumers
          for p in (*consumer_grants(c.stream, c.durable, c.filter_subject),
                    deadletter.dead_letter_subject(c.durable))),
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
        # Its answers' claims (one final chunk per run), and the claim found first.
        f"{response.CLAIM_SUBJECT_PREFIX}.>",
        f"$JS.API.STREAM.MSG.GET.{response.CLAIM_STREAM}",
        f"$JS.API.DIRECT.GET.{response.CLAIM_STREAM}.>",
    ]
    subscribe = (*grant.subscribe, f"{inbox_prefix(service_user(worker))}.>",
                 *services_api_subjects(service_user(worker)))
    # One reply per services-API request, to whoever asked (its inbox is its own).
    return Permissions(publish=_unique(publish), subscribe=subscribe, allow_responses=True)


def services_api_subjects(name: str) -> tuple[str, ...]:
    """The control subjects a service called `name` listens on: all services', its
    name's, and its own instance's (`$SRV.<VERB>.<name>.<id>`)."""
    return (*(f"{SERVICES_API}.{verb}" for verb in SERVICES_VERBS),
            f"{SERVICES_API}.*.{name}", f"{SERVICES_API}.*.{name}.*")


def ops_permissions() -> Permissions:
    """The monitoring reader: ask the services API, read each stage's consumer and each
    stream's info (lag, dead letters); its own inbox. Nothing that changes state."""
    publish = [
        *(f"{SERVICES_API}.{verb}" for verb in SERVICES_VERBS),
        *(f"{SERVICES_API}.{verb}.>" for verb in SERVICES_VERBS),
        *(f"$JS.API.CONSUMER.INFO.{g.stream}.{g.durable}" for g in WORKER_GRANTS.values()),
        *(f"$JS.API.STREAM.INFO.{name}" for name in STREAM_SUBJECTS),
    ]
    return Permissions(publish=_unique(publish), subscribe=(f"{inbox_prefix(OPS_USER)}.>",))


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
