"""Who may do what on the bus: the permission matrix, as data.

Four kinds of user connect to NATS:
- `admin`: the `intentroute up` process and operator commands; everything (it declares
  the streams).
- one service user per worker type (`intentroute-<worker>`): a stage's worker its
  durable consumer and the subjects its stage hands off to, nothing else
  (`WORKER_GRANTS`); a worker that reads no stage what it does on agents' behalf
  (`CLIENT_GRANTS`: the doors publish agents' requests and verdicts and follow their
  answers and replays; the learner only answers the services API). Workers never
  create, update or delete streams. Each answers the services API (`$SRV.PING / INFO
  / STATS`) under its own name only: it subscribes to the control subjects of every
  service and of its name, and replies to each request once (`allow_responses`)
  without any publish grant on another user's inbox.
- `intentroute-ops`: the monitoring reader (`intentroute status`, a scraper's sidecar):
  services-API requests, consumer and stream info; it cannot publish work, pull, ack,
  nor change a stream or consumer, so a monitoring host never holds the admin's power.
- one user per active agent: publish its own requests, feedback and replay requests,
  read its own responses (feedback acknowledgements included). No JetStream API at all:
  a late replay is the gateway's (`agent.replay.<id>`, services/gateway/replay_service.py), since
  a consumer an agent created could be durable (never expiring) or push its deliveries
  to any subject, past the subject permissions, into other streams.

Every user may subscribe only to its own reply inbox `_INBOX.<user>.>` (clients pass
`inbox_prefix`), so nobody reads another user's replies or JetStream acks.

Accounts: the stack's users (admin, ops, services) share the account `INTENTROUTE`,
which holds the streams; each agent is alone in an account named after it, which holds
no stream and imports only its own subjects from `INTENTROUTE` (`agent_imports`). A
message carries a reply subject its sender chooses, and JetStream's publish
acknowledgement (or any service's answer) goes to it with the server's own rights, past
every permission: within one account an agent publishing its own request with the reply
subject `agent.response.<victim>.<id>` had its acknowledgement stored on the victim's
answer. Across a service import the server replaces the reply subject with one of its
own (`_R_.…`) that leads back into the asker's account only, so an agent's reply
subjects can only ever reach its own account, where nothing but its own subjects exist.

The server config (`intentroute.stack.natsconf`) is rendered from this module only.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from shared.auth.natsconn import inbox_prefix
from shared.contracts import (
    circuits,
    deadletter,
    feedback,
    pipeline,
    replay,
    request,
    response,
    turn_rows,
)
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
    turn_rows.STREAM: (turn_rows.SUBJECTS,),
    circuits.STREAM: (circuits.SUBJECTS,),
}


class Permissions(NamedTuple):
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    # Lets a user answer a message it received with a reply subject (services-API
    # requests, replay requests) without a publish grant on the asker's inbox: at most
    # `max_responses` messages within `responses_seconds` of the request (the server's
    # defaults, 1 message and 2 minutes, when `max_responses` is 1).
    allow_responses: bool = False
    max_responses: int = 1
    responses_seconds: float = 0.0


# The account of the stack's own users and of every stream (JetStream is enabled there
# only); agents' accounts are named after them (`agent_id_problem` keeps an agent id
# from taking it or the server's `$SYS`).
APP_ACCOUNT = "INTENTROUTE"


class Export(NamedTuple):
    """A subject `APP_ACCOUNT` lets the agents' accounts import: a `service` (requests
    whose answers go back through the server's reply mapping: `response_type` "stream"
    for several answers within `response_seconds`) or a `stream` (messages delivered)."""

    kind: str
    subject: str
    response_type: str = ""
    response_seconds: float = 0.0


class Import(NamedTuple):
    """One subject an agent's account takes from `APP_ACCOUNT`: its own, never another's."""

    kind: str
    subject: str


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
    # One durable consumer per agent, `<durable>-<agent_id>` filtered to the agent's
    # subject under `filter_subject` (the gateway's fair share), instead of `durable`.
    per_agent: bool = False
    # Replies it may send to one request it received (`Permissions.max_responses`).
    max_responses: int = 1
    responses_seconds: float = 0.0
    # Also reads what the monitoring reader reads (`monitoring_subjects`; no stage does:
    # the dashboard is the doors', CLIENT_GRANTS).
    monitors: bool = False
    # Calls model servers: reads and writes their shared circuits (shared.llm.circuit).
    models: bool = False


# A replay is answered with one reply per stored chunk, within this window of the
# request (services/gateway/replay_service.py stops before either bound, with a final chunk).
REPLAY_MAX_REPLIES = 10_000
REPLAY_REPLY_SECONDS = 600.0
# The gateway's replay consumers: named, on AGENT_RESPONSES, filtered to one answer.
REPLAY_CONSUMER_CREATE = f"$JS.API.CONSUMER.CREATE.{response.STREAM}.*.{AGENT_RESPONSE_ANY}"
REPLAY_CONSUMER_DELETE = f"$JS.API.CONSUMER.DELETE.{response.STREAM}.*"

# The stages that end a part of a split message hand the next part to its first stage
# (shared.runtime.message_parts): the retriever, or a slot's generator (RC-04).
NEXT_PART = (pipeline.RETRIEVE_SUBJECT, pipeline.generate_subject(ModelSlot.MAIN),
             pipeline.generate_subject(ModelSlot.CONVERSATIONAL))

WORKER_GRANTS: dict[str, WorkerGrant] = {
    # Admission: every agent's requests, in fair turns, handed to the classifier. It
    # also reads every agent's feedback and acknowledges it on that agent's responses,
    # and serves agents' late replays (`agent.replay.*`) through short-lived consumers
    # of its own, answering each on the asker's reply subject.
    "gateway": WorkerGrant(
        stream=request.STREAM, durable="gateway", filter_subject=AGENT_REQUEST_ANY,
        per_agent=True,
        publish=(pipeline.CLASSIFY_SUBJECT, FEEDBACK_ACK_ANY,
                 REPLAY_CONSUMER_CREATE, REPLAY_CONSUMER_DELETE,
                 # What the stages' replicas hold, against what their consumers have
                 # delivered: messages a dead replica holds leave admission's count
                 # (services/gateway/fair_consumer.py). Reads only.
                 f"$JS.API.CONSUMER.LIST.{pipeline.STREAM}", f"{SERVICES_API}.STATS"),
        subscribe=(replay.SUBJECTS,),
        consumers=(ConsumerGrant(feedback.STREAM, FEEDBACK_DURABLE, AGENT_FEEDBACK_ANY),),
        max_responses=REPLAY_MAX_REPLIES, responses_seconds=REPLAY_REPLY_SECONDS,
    ),
    "classifier": WorkerGrant(
        models=True,
        stream=pipeline.STREAM, durable="classifier", filter_subject=pipeline.CLASSIFY_SUBJECT,
        publish=(pipeline.RETRIEVE_SUBJECT, f"{pipeline.GENERATE_SUBJECT_PREFIX}.*"),
    ),
    "retriever": WorkerGrant(
        models=True,
        stream=pipeline.STREAM, durable="retriever", filter_subject=pipeline.RETRIEVE_SUBJECT,
        publish=(pipeline.generate_subject(ModelSlot.MAIN),
                 pipeline.generate_subject(ModelSlot.CONVERSATIONAL)),
    ),
    "generator-main": WorkerGrant(
        models=True,
        stream=pipeline.STREAM, durable="generator-main",
        filter_subject=pipeline.generate_subject(ModelSlot.MAIN),
        publish=(pipeline.VALIDATE_SUBJECT, *NEXT_PART),
    ),
    "generator-conversational": WorkerGrant(
        models=True,
        stream=pipeline.STREAM, durable="generator-conversational",
        filter_subject=pipeline.generate_subject(ModelSlot.CONVERSATIONAL),
        publish=NEXT_PART,
    ),
    # RC-08: one trace-guided retry goes back to the main generator.
    "validator": WorkerGrant(
        stream=pipeline.STREAM, durable="validator", filter_subject=pipeline.VALIDATE_SUBJECT,
        publish=(pipeline.generate_subject(ModelSlot.MAIN), *NEXT_PART),
    ),
}

class ClientGrant(NamedTuple):
    """A worker type that reads no stage: what it publishes and reads on agents' behalf
    (no JetStream API: a publish's ack comes to its own inbox), and whether it also
    reads what the monitoring reader reads (`monitoring_subjects`)."""

    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    monitors: bool = False


DOORS = "doors"
LEARNER = "learner"

CLIENT_GRANTS: dict[str, ClientGrant] = {
    # gRPC, HTTP feedback, the OpenAI-compatible door and the dashboard: an agent's
    # request and verdict published on its behalf once its bearer token is checked, the
    # answer and the ack followed, a replay asked after a reconnect (answered on the
    # doors' own inbox); the dashboard shows each stage's lag and errors.
    DOORS: ClientGrant(
        publish=(AGENT_REQUEST_ANY, AGENT_FEEDBACK_ANY, replay.SUBJECTS),
        subscribe=(AGENT_RESPONSE_ANY, FEEDBACK_ACK_ANY),
        monitors=True,
    ),
    # The learning job works in Postgres: on the bus it only answers the services API.
    LEARNER: ClientGrant(),
}


# What the agents' accounts may import: requests and feedback (one answer each: the
# stream's acknowledgement), replay requests (many answers: the stored chunks, within
# the replay's bounds) and the answer stream. The same for every agent, so adding one
# changes no export; each agent's account imports its own subjects only (agent_imports).
APP_EXPORTS: tuple[Export, ...] = (
    Export("service", request.SUBJECTS),
    Export("service", feedback.SUBJECTS),
    Export("service", replay.SUBJECTS, response_type="stream",
           response_seconds=REPLAY_REPLY_SECONDS),
    Export("stream", f"{response.SUBJECT_PREFIX}.>"),
)


def agent_imports(agent_id: str) -> tuple[Import, ...]:
    """An agent's account: its request, feedback and replay subjects as services of
    `APP_ACCOUNT`, its own answers (feedback acknowledgements included) as a stream."""
    return (
        Import("service", request.request_subject(agent_id)),
        Import("service", feedback.feedback_subject(agent_id)),
        Import("service", replay.replay_subject(agent_id)),
        Import("stream", response.agent_responses(agent_id)),
    )


def agent_id_problem(agent_id: str) -> str:
    """Why `agent_id` cannot name an agent, or "" when it can."""
    if not _AGENT_ID.fullmatch(agent_id):
        return "an agent id is 1 to 64 characters of A-Z, a-z, 0-9, '_' and '-'"
    if agent_id == ADMIN_USER or agent_id.lower().startswith(_RESERVED_PREFIX):
        # (`APP_ACCOUNT` starts with the reserved prefix too: no agent's account takes it.)
        return f"{agent_id!r} is reserved for the stack's own users"
    return ""


def service_user(worker: str) -> str:
    return f"{SERVICE_PREFIX}{worker}"


# Every worker type with a NATS user: the stages', then the clients'.
NATS_WORKERS: tuple[str, ...] = (*WORKER_GRANTS, *CLIENT_GRANTS)
SERVICE_USERS: dict[str, str] = {service_user(w): w for w in NATS_WORKERS}
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


def per_agent_consumer_grants(stream: str, durable: str, filter_subject: str
                              ) -> tuple[str, ...]:
    """JetStream API subjects for one consumer per agent on `stream`: create one whose
    filter is an agent's subject (`filter_subject` is `agent.request.*`: one token per
    agent; a subject token cannot hold a name prefix, so the consumer's name is `*`),
    pull and ack on any consumer of the stream (only the gateway's exist there: agents
    have no JetStream API), list them (the lag is their sum), and delete the catch-all
    `durable` they replace (it overlaps them all, so the stream refuses them while it
    exists)."""
    return (
        f"$JS.API.CONSUMER.CREATE.{stream}.*.{filter_subject}",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.*",
        f"$JS.ACK.{stream}.*.>",
        f"$JS.API.CONSUMER.LIST.{stream}",
        f"$JS.API.CONSUMER.DELETE.{stream}.{durable}",
    )


def client_permissions(worker: str) -> Permissions:
    """A worker that reads no stage: its grant, its own inbox, the services API under its
    name (one reply per request)."""
    grant = CLIENT_GRANTS[worker]
    publish = [*grant.publish, *(monitoring_subjects() if grant.monitors else ())]
    subscribe = (*grant.subscribe, f"{inbox_prefix(service_user(worker))}.>",
                 *services_api_subjects(service_user(worker)))
    return Permissions(publish=_unique(publish), subscribe=subscribe, allow_responses=True)


def service_permissions(worker: str) -> Permissions:
    if worker in CLIENT_GRANTS:
        return client_permissions(worker)
    grant = WORKER_GRANTS[worker]
    own_consumers = per_agent_consumer_grants if grant.per_agent else consumer_grants
    publish = [
        *own_consumers(grant.stream, grant.durable, grant.filter_subject),
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
        # Direct gets by subject only (`$JS.API.DIRECT.GET.<stream>.<subject>` reads the
        # last message of the subject it names; STREAM.MSG.GET, or a direct get without
        # a subject, would page through every agent's answers by sequence). A grant's
        # `*` also admits a literal `*` in the name, which the server reads as a
        # wildcard, and no NATS grant can refuse that: a stage's credential can read the
        # newest message matching a pattern (one answer), never the stream's history
        # (docs/reference/permissions-nats.md; shared.runtime.bus).
        f"$JS.API.DIRECT.GET.{response.STREAM}.{AGENT_RESPONSE_ANY}",
        # Its answers' claims (one final chunk per run), and the claim found first.
        f"{response.CLAIM_SUBJECT_PREFIX}.>",
        f"$JS.API.DIRECT.GET.{response.CLAIM_STREAM}.{response.CLAIM_SUBJECT_PREFIX}.>",
        # A turn's rows queued while Postgres is away, whether a session has any, and
        # the row writer every worker runs (shared.runtime.row_queue).
        turn_rows.SUBJECTS,
        f"$JS.API.DIRECT.GET.{turn_rows.STREAM}.{turn_rows.SUBJECTS}",
        *consumer_grants(turn_rows.STREAM, turn_rows.DURABLE, turn_rows.SUBJECTS),
        deadletter.dead_letter_subject(turn_rows.DURABLE),
        *(monitoring_subjects() if grant.monitors else ()),
        *(circuit_subjects() if grant.models else ()),
    ]
    # A per-agent reader hears every publication on its subject (the doorbell saying
    # which agent has requests waiting).
    doorbell = (grant.filter_subject,) if grant.per_agent else ()
    subscribe = (*grant.subscribe, *doorbell, f"{inbox_prefix(service_user(worker))}.>",
                 *services_api_subjects(service_user(worker)))
    # One reply per services-API request, to whoever asked (its inbox is its own); the
    # gateway's replays send several.
    return Permissions(publish=_unique(publish), subscribe=subscribe, allow_responses=True,
                       max_responses=grant.max_responses,
                       responses_seconds=grant.responses_seconds)


def circuit_subjects() -> tuple[str, ...]:
    """The model backends' circuits (the key-value bucket LLM_CIRCUITS): read a key,
    write one (compare-and-set)."""
    return (circuits.SUBJECTS, f"$JS.API.DIRECT.GET.{circuits.STREAM}.{circuits.SUBJECTS}")


def services_api_subjects(name: str) -> tuple[str, ...]:
    """The control subjects a service called `name` listens on: all services', its
    name's, and its own instance's (`$SRV.<VERB>.<name>.<id>`)."""
    return (*(f"{SERVICES_API}.{verb}" for verb in SERVICES_VERBS),
            f"{SERVICES_API}.*.{name}", f"{SERVICES_API}.*.{name}.*")


def monitoring_subjects() -> list[str]:
    """Ask the services API, read each stage's consumer and each stream's info (lag,
    dead letters). Nothing that changes state."""
    return [
        *(f"{SERVICES_API}.{verb}" for verb in SERVICES_VERBS),
        *(f"{SERVICES_API}.{verb}.>" for verb in SERVICES_VERBS),
        *(f"$JS.API.CONSUMER.LIST.{g.stream}" if g.per_agent
          else f"$JS.API.CONSUMER.INFO.{g.stream}.{g.durable}" for g in WORKER_GRANTS.values()),
        *(f"$JS.API.STREAM.INFO.{name}" for name in STREAM_SUBJECTS),
    ]


def ops_permissions() -> Permissions:
    """The monitoring reader: `monitoring_subjects` and its own inbox."""
    return Permissions(publish=_unique(monitoring_subjects()),
                       subscribe=(f"{inbox_prefix(OPS_USER)}.>",))


def agent_permissions(agent_id: str) -> Permissions:
    """Its own requests, feedback and replay requests (answered by the gateway), its own
    responses, its own inbox. No JetStream API: no consumer of its own, durable or
    push, no stream listing."""
    publish = [
        request.request_subject(agent_id),
        feedback.feedback_subject(agent_id),
        replay.replay_subject(agent_id),
    ]
    subscribe = [response.agent_responses(agent_id), f"{inbox_prefix(agent_id)}.>"]
    return Permissions(publish=tuple(publish), subscribe=tuple(subscribe))


def _unique(items: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))
