"""What every NATS user of the deployment may publish and subscribe to, probed on a live
nats-server and rendered as Markdown (`docs/reference/permissions-nats.md`,
`intentroute docs permissions-nats`).

The server is configured as `intentroute up` configures it: the admin's, the ops
reader's and the service users' credentials from `ensure_service_users`, the auth part
from `write_auth` (intentroute.stack.natsconf, from shared.auth.permissions), with two
agents, `agent-a` and `agent-b`, each alone in its account. Every user but `agent-b`
connects and, on one connection, subscribes to and publishes on every subject of the
canonical list (`probes`); nats-server answers each one it forbids with an asynchronous
`Permissions Violation` error, and what it did not refuse is what the user may do.

The list holds every subject of the agents' and the pipeline's contracts (an agent's of
`<self>`, the agent probed, and of `<other>`, another), the JetStream API's verbs on each
stream and each consumer of it (those the workers use and one, `probe`, no one uses),
the services API, the system account's, every user's inbox and a few wide wildcard
subscriptions. Each subject any probed user is granted (in the rendered config) is
matched by one of them; one that is not (a new grant) gets a row of its own. So a grant
the committed table does not list makes the rendering differ from it
(tests/integration/test_nats_permission_table.py).

Nothing a probe does changes anything: no stream exists on the probed server (a
JetStream API request finds none), every message is published without a reply subject
and its body is not JSON (a stream or consumer create or update is refused for it).
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import nats

from shared.auth.natsconn import inbox_prefix, read_credential
from shared.auth.permissions import (
    ADMIN_USER,
    APP_ACCOUNT,
    NATS_WORKERS,
    OPS_USER,
    SERVICES_API,
    SERVICES_VERBS,
    STREAM_SUBJECTS,
    WORKER_GRANTS,
    service_user,
)
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
from shared.runtime.consumer import agent_consumer_name

# Where the committed copy lives (relative to the repository root, the usual cwd).
DEFAULT_OUT = Path("docs/reference/permissions-nats.md")

SELF, OTHER = "<self>", "<other>"
SELF_AGENT, OTHER_AGENT = "agent-a", "agent-b"
AGENTS = (SELF_AGENT, OTHER_AGENT)
# A consumer name no worker uses; a request id, a session id and a run.
PROBE_CONSUMER = "probe"
REQUEST_ID, SESSION_ID, RUN = "req-1", "s1", "1"
# Every probe's body: not JSON, so no JetStream API request that reads one (a stream's or
# a consumer's create, update, restore, purge, message delete, snapshot) takes it.
PAYLOAD = b"probe: not JSON"
# Published last by every user: a refusal of it means the server has sent the refusals
# of everything before it (it answers one connection's commands in order).
SENTINEL = "intentroute.probe.sentinel"
# How long the refusals of a user the sentinel is not refused to may keep arriving; how
# long to wait for the sentinel's refusal.
QUIET_SECONDS = 0.5
SENTINEL_TIMEOUT = 15.0

_VIOLATION = re.compile(r'permissions violation for (publish|subscription) to "([^"]*)"',
                        re.IGNORECASE)
# nats-server's allow_responses defaults (`allow_responses: true`).
_DEFAULT_RESPONSES = "1 reply within 2m (the server's defaults)"

# The JetStream API's stream verbs (`$JS.API.STREAM.<VERB>.<stream>`) and consumer verbs
# (`$JS.API.CONSUMER.<VERB>.<stream>.<consumer>`).
STREAM_VERBS = ("INFO", "CREATE", "UPDATE", "DELETE", "PURGE", "MSG.GET", "MSG.DELETE",
                "SNAPSHOT", "RESTORE")
CONSUMER_VERBS = ("DURABLE.CREATE", "INFO", "DELETE", "MSG.NEXT")


class Probe(NamedTuple):
    """One row: a subject (`<self>`, `<other>` for the agents') in a section; a wildcard
    subscription's row is a subscription only (`publish` False)."""

    section: str
    subject: str
    publish: bool = True


class Role(NamedTuple):
    """One column: the user probed."""

    column: str
    user: str


def roles() -> list[Role]:
    """The admin, the ops reader, each service user (the stages', the doors', the
    learner's), an agent (`<self>`)."""
    return [Role("admin", ADMIN_USER), Role("ops", OPS_USER),
            *(Role(worker, service_user(worker)) for worker in NATS_WORKERS),
            Role("agent", SELF_AGENT)]


def concrete(subject: str) -> str:
    """A row's subject as probed: `<self>` and `<other>` are the two agents."""
    return subject.replace(SELF, SELF_AGENT).replace(OTHER, OTHER_AGENT)


def placeholders(subject: str) -> str:
    """A subject's row: the agents' ids as `<self>` and `<other>`."""
    names = {SELF_AGENT: SELF, OTHER_AGENT: OTHER}
    return ".".join(names.get(token, token) for token in subject.split("."))


def matches(pattern: str, subject: str) -> bool:
    """Whether NATS subject `pattern` (`*`, `>`) matches the literal `subject`."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or token not in ("*", have[i]):
            return False
    return len(want) == len(have)


def _literal(subject: str) -> bool:
    return not {"*", ">"} & set(subject.split("."))


# Per stream: subjects of one message (an agent's own and another's where the subject
# names an agent), and wildcard ones; a stream added later shows its own subjects.
def _stream_subjects() -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    def both(make: Callable[[str], str]) -> tuple[str, ...]:
        return (make(SELF), make(OTHER))

    return {
        request.STREAM: (both(request.request_subject), (request.SUBJECTS,)),
        feedback.STREAM: (both(feedback.feedback_subject), (feedback.SUBJECTS,)),
        pipeline.STREAM: ((pipeline.CLASSIFY_SUBJECT,), STREAM_SUBJECTS[pipeline.STREAM]),
        response.STREAM: (
            both(lambda a: response.response_subject(a, REQUEST_ID)),
            (response.response_subject(OTHER, "*"), response.response_subject("*", "*"),
             *STREAM_SUBJECTS[response.STREAM])),
        response.CLAIM_STREAM: (
            both(lambda a: response.claim_subject(a, REQUEST_ID, RUN)),
            (f"{response.CLAIM_SUBJECT_PREFIX}.{OTHER}.>",
             *STREAM_SUBJECTS[response.CLAIM_STREAM])),
        deadletter.STREAM: ((deadletter.dead_letter_subject(_durables()[0]),),
                            STREAM_SUBJECTS[deadletter.STREAM]),
        turn_rows.STREAM: (
            both(lambda a: turn_rows.rows_subject(a, SESSION_ID)),
            (f"{turn_rows.SUBJECT_PREFIX}.{OTHER}.>", turn_rows.SUBJECTS)),
    }


def _consumers() -> dict[str, list[tuple[str, tuple[str, ...]]]]:
    """Per stream, (consumer, the filters it is created with) of every durable consumer
    the workers read (a per-agent one's for both agents, and the catch-all it replaces)."""
    found: dict[str, list[tuple[str, tuple[str, ...]]]] = defaultdict(list)
    for grant in WORKER_GRANTS.values():
        found[grant.stream].append((grant.durable, (grant.filter_subject,)))
        if grant.per_agent:
            found[grant.stream] += [
                (agent_consumer_name(grant.durable, agent),
                 (grant.filter_subject.replace("*", agent),)) for agent in (SELF, OTHER)]
        for more in grant.consumers:
            found[more.stream].append((more.durable, (more.filter_subject,)))
    found[turn_rows.STREAM].append((turn_rows.DURABLE, (turn_rows.SUBJECTS,)))
    return found


def _durables() -> list[str]:
    """Every durable consumer whose dead letters a worker publishes."""
    names = [g.durable for g in WORKER_GRANTS.values()]
    names += [c.durable for g in WORKER_GRANTS.values() for c in g.consumers]
    return [*dict.fromkeys([*names, turn_rows.DURABLE])]


def _agent_rows() -> list[Probe]:
    section = "Agents' subjects"
    return [Probe(section, subject) for agent in (SELF, OTHER) for subject in (
        request.request_subject(agent), feedback.feedback_subject(agent),
        replay.replay_subject(agent), response.response_subject(agent, REQUEST_ID),
        feedback.ack_subject(agent, REQUEST_ID))]


def _internal_rows() -> list[Probe]:
    section = "Pipeline, claims, turn rows, dead letters, circuits"
    stages = [pipeline.CLASSIFY_SUBJECT, pipeline.RETRIEVE_SUBJECT,
              *(pipeline.generate_subject(slot) for slot in ModelSlot),
              pipeline.VALIDATE_SUBJECT, response.INTERNAL_INVALID_SUBJECT]
    claims = [subject for agent in (SELF, OTHER) for subject in (
        response.claim_subject(agent, REQUEST_ID, RUN),
        response.sent_subject(agent, REQUEST_ID, RUN),
        response.admission_subject(agent, REQUEST_ID))]
    rows = [turn_rows.rows_subject(agent, SESSION_ID) for agent in (SELF, OTHER)]
    dead = [deadletter.dead_letter_subject(durable) for durable in _durables()]
    # The model backends' circuits: a key written (compare-and-set) by name.
    keys = [circuits.SUBJECTS]
    return [Probe(section, s) for s in (*stages, *claims, *rows, *dead, *keys)]


def _account_rows() -> list[Probe]:
    section = "JetStream API: the account"
    return [Probe(section, s) for s in (
        "$JS.API.INFO", "$JS.API.STREAM.LIST", "$JS.API.STREAM.NAMES",
        f"$JS.API.ACCOUNT.PURGE.{APP_ACCOUNT}")]


def _stream_rows(stream: str, consumers: Sequence[tuple[str, tuple[str, ...]]],
                 subjects: tuple[tuple[str, ...], tuple[str, ...]]) -> list[Probe]:
    one, wild = subjects
    found = [f"$JS.API.STREAM.{verb}.{stream}" for verb in STREAM_VERBS]
    found += [f"$JS.API.DIRECT.GET.{stream}",
              *(f"$JS.API.DIRECT.GET.{stream}.{s}" for s in (*one, *wild)),
              f"$JS.API.CONSUMER.LIST.{stream}", f"$JS.API.CONSUMER.NAMES.{stream}",
              f"$JS.API.CONSUMER.CREATE.{stream}"]
    for name, filters in [*consumers, (PROBE_CONSUMER, (*one, *wild))]:
        found += [f"$JS.API.CONSUMER.CREATE.{stream}.{name}",
                  *(f"$JS.API.CONSUMER.CREATE.{stream}.{name}.{f}" for f in filters),
                  *(f"$JS.API.CONSUMER.{verb}.{stream}.{name}" for verb in CONSUMER_VERBS),
                  f"$JS.ACK.{stream}.{name}.1.1.1.1.0"]
    section = f"JetStream API: stream `{stream}`"
    return [Probe(section, s) for s in found]


def _service_rows() -> list[Probe]:
    section = "Services API, system account, inboxes"
    names = [service_user(worker) for worker in NATS_WORKERS]
    found = [f"{SERVICES_API}.{verb}" for verb in SERVICES_VERBS]
    # Each verb to one service's name (and to an instance of it, `.<id>`).
    ping, info, stats = SERVICES_VERBS
    found += [s for name in names for s in (
        f"{SERVICES_API}.{ping}.{name}", f"{SERVICES_API}.{info}.{name}.id-1",
        f"{SERVICES_API}.{stats}.{name}")]
    found.append("$SYS.REQ.SERVER.PING")
    users = [ADMIN_USER, OPS_USER, *names, SELF, OTHER]
    found += [f"{inbox_prefix(user)}.probe" for user in users]
    return [Probe(section, s) for s in found]


def _wildcard_rows() -> list[Probe]:
    section = "Wildcard subscriptions"
    found = [">", "agent.>", request.SUBJECTS, feedback.SUBJECTS, replay.SUBJECTS,
             f"{response.SUBJECT_PREFIX}.>", response.agent_responses(SELF),
             response.agent_responses(OTHER), f"{response.SUBJECT_PREFIX}.*.*",
             "intentroute.>", f"{pipeline.SUBJECT_PREFIX}.>", "$JS.API.>", "$JS.ACK.>",
             "$JS.EVENT.>", f"{SERVICES_API}.>", "$SYS.>", "_INBOX.>", "_R_.>"]
    return [Probe(section, s, publish=False) for s in found]


def probes() -> list[Probe]:
    """The canonical rows, in order (no subject twice)."""
    consumers, subjects = _consumers(), _stream_subjects()
    found = [*_agent_rows(), *_internal_rows(), *_account_rows()]
    for stream in STREAM_SUBJECTS:
        found += _stream_rows(stream, consumers.get(stream, []),
                              subjects.get(stream, ((), STREAM_SUBJECTS[stream])))
    found += [*_service_rows(), *_wildcard_rows()]
    unique: dict[str, Probe] = {}
    for probe in found:
        unique.setdefault(probe.subject, probe)
    return list(unique.values())


# The rendered config (the auth part: `accounts: {...}` as JSON).


@dataclass(frozen=True)
class User:
    name: str
    account: str
    # None: no permissions block (every subject).
    publish: tuple[str, ...] | None
    subscribe: tuple[str, ...] | None
    allow_responses: Any


@dataclass(frozen=True)
class Account:
    name: str
    jetstream: bool
    users: tuple[str, ...]
    exports: tuple[str, ...]
    imports: tuple[str, ...]


def read_config(auth_text: str) -> tuple[dict[str, User], list[Account]]:
    """Users (by name) and accounts of an auth part as natsconf renders it."""
    accounts = json.loads(auth_text.partition(":")[2])
    users: dict[str, User] = {}
    found = []
    for name, body in accounts.items():
        for entry in body.get("users", []):
            perms = entry.get("permissions")
            users[entry["user"]] = User(
                entry["user"], name,
                tuple(perms["publish"]["allow"]) if perms else None,
                tuple(perms["subscribe"]["allow"]) if perms else None,
                perms.get("allow_responses") if perms else None)
        found.append(Account(
            name, body.get("jetstream") == "enabled",
            tuple(entry["user"] for entry in body.get("users", [])),
            tuple(_export(e) for e in body.get("exports", [])),
            tuple(f"{kind} `{placeholders(spec['subject'])}` from `{spec['account']}`"
                  for i in body.get("imports", []) for kind, spec in i.items())))
    return users, found


def _export(entry: Mapping[str, Any]) -> str:
    kind = "service" if "service" in entry else "stream"
    text = f"{kind} `{entry[kind]}`"
    extra = [f"responses: {entry['response_type']}"] if "response_type" in entry else []
    if "response_threshold" in entry:
        extra.append(f"within {entry['response_threshold']}")
    return text + (f" ({', '.join(extra)})" if extra else "")


def _granted(user: User, publish: bool) -> tuple[str, ...] | None:
    return user.publish if publish else user.subscribe


def with_granted(rows: Sequence[Probe], users: Mapping[str, User]) -> list[Probe]:
    """`rows` and, in a section of their own, each subject a probed user is granted that
    no row's subject is or matches (every row subscribes; publish only where it does)."""
    extra: set[str] = set()
    for role in roles():
        user = users[role.user]
        for publish in (True, False):
            probed = [concrete(r.subject) for r in rows if r.publish or not publish]
            for pattern in _granted(user, publish) or ():
                if not any(s == pattern or (_literal(s) and matches(pattern, s))
                           for s in probed):
                    extra.add(placeholders(pattern))
    return [*rows, *(Probe("Other granted subjects", s) for s in sorted(extra))]


# Probing.


class Refused(NamedTuple):
    publish: frozenset[str]
    subscribe: frozenset[str]


async def probe_user(url: str, connect: Mapping[str, Any], rows: Sequence[Probe], *,
                     sentinel_refused: bool) -> Refused:
    """Subscribe to and publish on every row's subject as one user, on one connection;
    what the server refused. With `sentinel_refused` the user may not publish on
    SENTINEL, published last: its refusal comes after every other one."""
    errors: list[str] = []
    changed = asyncio.Event()

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))
        changed.set()

    nc = await nats.connect(url, error_cb=on_error, allow_reconnect=False,
                            max_reconnect_attempts=0, **dict(connect))
    try:
        for row in rows:
            await nc.subscribe(concrete(row.subject))
        for row in rows:
            if row.publish:
                await nc.publish(concrete(row.subject), PAYLOAD)
        await nc.publish(SENTINEL, PAYLOAD)
        # The first flush wakes the writer of what is buffered; the second's PING follows
        # all of it (tests/helpers/nats_sync.py).
        await nc.flush(timeout=10)
        await nc.flush(timeout=10)
        await _refusals_in(errors, changed, sentinel_refused)
        if not nc.is_connected:
            raise RuntimeError(f"nats-server closed {connect.get('user')}'s connection: "
                               f"{errors[-3:]}")
    finally:
        await nc.close()
    # The server's error names the subject in lower case.
    subjects = {concrete(row.subject).lower(): concrete(row.subject) for row in rows}
    if len(subjects) != len(rows):
        raise ValueError("two probed subjects differ in case only: their refusals would "
                         "be told apart by nothing")
    refused: dict[str, set[str]] = {"publish": set(), "subscription": set()}
    for error in errors:
        found = _VIOLATION.search(error)
        if found and found.group(2).lower() in subjects:
            refused[found.group(1).lower()].add(subjects[found.group(2).lower()])
    return Refused(frozenset(refused["publish"]), frozenset(refused["subscription"]))


async def _refusals_in(errors: list[str], changed: asyncio.Event, sentinel: bool) -> None:
    """Until the sentinel's refusal came (`sentinel`) or, without one, no error came
    for QUIET_SECONDS."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SENTINEL_TIMEOUT
    marker = f'"{SENTINEL.lower()}"'
    while True:
        if sentinel and any(marker in e.lower() for e in errors):
            return
        remaining = deadline - loop.time()
        if remaining <= 0:
            if sentinel:
                raise TimeoutError(f"no refusal of {SENTINEL} within {SENTINEL_TIMEOUT:g}s")
            return
        changed.clear()
        try:
            await asyncio.wait_for(changed.wait(),
                                   min(remaining, SENTINEL_TIMEOUT if sentinel
                                       else QUIET_SECONDS))
        except TimeoutError:
            if not sentinel:
                return


async def probe_server(url: str, logins: Mapping[str, Mapping[str, Any]],
                       users: Mapping[str, User], rows: Sequence[Probe]
                       ) -> dict[str, Refused]:
    """Every role's refusals (by column), all users at once."""
    def refuses_sentinel(user: User) -> bool:
        return user.publish is not None and not any(matches(p, SENTINEL)
                                                     for p in user.publish)

    found = await asyncio.gather(*(
        probe_user(url, logins[role.user], rows,
                   sentinel_refused=refuses_sentinel(users[role.user]))
        for role in roles()))
    return {role.column: refused for role, refused in zip(roles(), found, strict=True)}


# Rendering.


def _cell(row: Probe, refused: Refused) -> str:
    subject = concrete(row.subject)
    can = [name for name, allowed in (
        ("pub", row.publish and subject not in refused.publish),
        ("sub", subject not in refused.subscribe)) if allowed]
    return "+".join(can) or "—"


def _row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows)]


def _code(text: str) -> str:
    return f"`{text}`"


def _responses(value: Any) -> str:
    if value is None or value is False:
        return "—"
    if value is True:
        return _DEFAULT_RESPONSES
    return f"{value['max']} replies within {value['expires']}"


def _permissions_summary(user: User) -> str:
    if user.publish is None:
        return "none: every subject"
    return f"{len(user.publish)} publish, {len(user.subscribe or ())} subscribe"


def render(users: Mapping[str, User], accounts: Sequence[Account], rows: Sequence[Probe],
           refused: Mapping[str, Refused]) -> str:
    """The Markdown document (ends with one newline)."""
    columns = roles()
    out = [
        "# NATS permissions",
        "",
        "<!-- Generated by `intentroute docs permissions-nats`; do not edit by hand.",
        "     tests/integration/test_nats_permission_table.py fails when a live server",
        "     configured as `intentroute up` configures it allows anything else. -->",
        "",
        "What each NATS user may publish and subscribe to, probed on a live nats-server "
        "whose users and accounts are rendered as `intentroute up` renders them "
        "(`intentroute.stack.natsconf`, from `shared.auth.permissions`), with two agents, "
        f"`{SELF_AGENT}` and `{OTHER_AGENT}`. Each user subscribes to every subject below "
        "and publishes on it; what nats-server does not refuse (a `Permissions Violation` "
        "error) is what the user may do:",
        "",
        "- a column per user: " + ", ".join(
            f"`{r.column}` is `{placeholders(r.user)}`" for r in columns)
        + f"; `{SELF}` is the agent probed (`{SELF_AGENT}`), `{OTHER}` another agent "
        f"(`{OTHER_AGENT}`): to the stack's users both are agents like any other;",
        "- `pub`: may publish, `sub`: may subscribe, `—`: neither; a wildcard "
        "subscription's row is a subscription only;",
        f"- `{PROBE_CONSUMER}`: a consumer name no worker uses; `{REQUEST_ID}`, "
        f"`{SESSION_ID}`, `{RUN}`: a request id, a session id, a run;",
        "- nothing was stored or changed: no stream exists on the probed server, and "
        "every probe is published without a reply subject and with a body that is not "
        "JSON.",
        "",
        "## Users",
        "",
    ]
    rows_users = []
    for role in columns:
        user = users[role.user]
        rows_users.append([_code(role.column), _code(placeholders(user.name)),
                           _code(placeholders(user.account)), _permissions_summary(user),
                           _responses(user.allow_responses)])
    out += _table(["column", "user", "account", "grants", "allow_responses"], rows_users)
    out += ["", "## Accounts", ""]
    out += _table(["account", "JetStream", "users", "exports", "imports"], [
        [_code(placeholders(a.name)), "enabled" if a.jetstream else "",
         ", ".join(_code(placeholders(u)) for u in a.users),
         "; ".join(a.exports), "; ".join(a.imports)] for a in accounts])
    header = ["subject", *(_code(r.column) for r in columns)]
    sections: dict[str, list[Probe]] = defaultdict(list)
    for row in rows:
        sections[row.section].append(row)
    for section, members in sections.items():
        out += ["", f"## {section}", ""]
        out += _table(header, [[_code(row.subject),
                                *(_cell(row, refused[r.column]) for r in columns)]
                               for row in members])
    out += ["", "## Grants as rendered", "",
            "The publish and subscribe allow lists of each user probed, as the config "
            "holds them (the agent's ids as placeholders).", ""]
    for role in columns:
        user = users[role.user]
        out.append(f"- `{placeholders(user.name)}`: " + (
            "no permissions block" if user.publish is None else
            "publish " + ", ".join(_code(placeholders(p)) for p in user.publish)
            + "; subscribe " + ", ".join(_code(placeholders(s))
                                         for s in user.subscribe or ())))
    return "\n".join(out) + "\n"


# The server.


def _agent_logins() -> tuple[list[tuple[str, str]], dict[str, dict[str, str]]]:
    """(agent id, secret hash) rows as the agents table holds them, and their logins."""
    from shared.auth.identity import hash_secret

    rows, logins = [], {}
    for agent in AGENTS:
        secret = secrets.token_urlsafe(32)
        rows.append((agent, hash_secret(secret)))
        logins[agent] = {"user": agent, "password": secret,
                         "inbox_prefix": inbox_prefix(agent)}
    return rows, logins


async def generate_async(state_dir: Path) -> str:
    """Configure and start a nats-server in `state_dir` as `up` does, probe it, stop it."""
    from intentroute.stack.nats_users import auth_files, ensure_service_users, write_auth
    from intentroute.stack.natsserver import NatsServer

    files = auth_files(state_dir)
    ensure_service_users(files)
    agents, logins = _agent_logins()
    # What `up`'s sync (`apply_agents`) writes for these agents; the server reads it at
    # its start as a restarted `up`'s does.
    write_auth(files, agents)
    for user in [ADMIN_USER, OPS_USER, *(service_user(w) for w in NATS_WORKERS)]:
        logins[user] = dict(read_credential(files.credential(user)).nats)
    users, accounts = read_config(files.auth.read_text(encoding="utf-8"))
    rows = with_granted(probes(), users)
    server = NatsServer(files.nats_dir, creds_dir=files.creds_dir)
    try:
        await asyncio.to_thread(server.start)
        refused = await probe_server(server.url, logins, users, rows)
    finally:
        await asyncio.to_thread(server.stop)
    return render(users, accounts, rows, refused)


def generate() -> str:
    """The document, from a throwaway nats-server."""
    with tempfile.TemporaryDirectory(prefix="intentroute-permissions-nats-") as tmp:
        return asyncio.run(generate_async(Path(tmp)))
