"""The permission matrix and the nats-server config rendered from it (no server)."""

from __future__ import annotations

import json
import re
import ssl
from pathlib import Path
from typing import Any

import pytest

from intentroute.stack.natsconf import (
    ServerTls,
    User,
    account_names,
    auth_config,
    server_config,
    stack_users,
)
from intentroute.stack.postgres import hba_to_scram, hba_uses_trust
from shared.auth.identity import split_token
from shared.auth.natsconn import connect_kwargs
from shared.auth.permissions import (
    ADMIN_USER,
    APP_ACCOUNT,
    DOORS,
    LEARNER,
    NATS_WORKERS,
    OPS_USER,
    REPLAY_MAX_REPLIES,
    REPLAY_REPLY_SECONDS,
    SERVICE_USERS,
    STACK_USERS,
    WORKER_GRANTS,
    agent_id_problem,
    agent_permissions,
    consumer_grants,
    monitoring_subjects,
    ops_permissions,
    service_permissions,
)
from shared.common.settings import CommonSettings
from shared.contracts.routing import ModelSlot
from shared.runtime.streams import broker_security

HASHES = {name: f"$2b$10$hash-of-{name}" for name in STACK_USERS}


def _auth_json(text: str) -> Any:
    prefix = "accounts: "
    assert text.startswith(prefix)
    return json.loads(text[len(prefix):])


def _users(text: str) -> dict[str, Any]:
    return {u["user"]: u for account in _auth_json(text).values() for u in account["users"]}


def test_an_agent_may_touch_only_its_own_subjects() -> None:
    perms = agent_permissions("alice")
    for subject in (*perms.publish, *perms.subscribe):
        assert "alice" in subject.split("."), subject
    # Its requests, verdicts and replay requests: no JetStream API subject at all.
    assert set(perms.publish) == {
        "agent.request.alice", "agent.feedback.alice", "agent.replay.alice"}
    assert set(perms.subscribe) == {"agent.response.alice.>", "_INBOX.alice.>"}
    # It answers nothing (no push consumer's flow control to reply to).
    assert not perms.allow_responses


def test_an_agent_has_no_stream_api_nor_pipeline_subject() -> None:
    perms = agent_permissions("alice")
    joined = " ".join(perms.publish + perms.subscribe)
    assert "$JS.API.STREAM" not in joined
    assert "intentroute.stage" not in joined
    # No consumer of its own, durable or push, anywhere (late replay is the gateway's).
    assert "$JS." not in joined


@pytest.mark.parametrize("worker", list(WORKER_GRANTS))
def test_a_worker_never_manages_streams_and_reads_only_its_inbox(worker: str) -> None:
    perms = service_permissions(worker)
    for verb in ("CREATE", "UPDATE", "DELETE", "PURGE", "NAMES", "LIST"):
        assert not any(p.startswith(f"$JS.API.STREAM.{verb}") for p in perms.publish)
    assert f"_INBOX.intentroute-{worker}.>" in perms.subscribe
    assert not any(s.startswith("_INBOX.") and worker not in s for s in perms.subscribe)
    assert not any(p.startswith("_INBOX") for p in perms.publish)
    # Services-API requests are answered through `allow_responses` (one reply each);
    # no stage asks them (the doors' dashboard does: below), but the gateway reads what
    # the stages' replicas hold (fair_consumer.py: a dead replica's messages).
    assert perms.allow_responses
    asks = ["$SRV.STATS"] if worker == "gateway" else []
    assert [p for p in perms.publish if p.startswith("$SRV")] == asks


def test_the_doors_publish_and_follow_on_agents_behalf_and_nothing_of_jetstream() -> None:
    """What the doors do for an authenticated caller: its request and verdict, the
    answer and the ack, a replay after a reconnect; the dashboard's read-only monitoring.
    No stage subject, no consumer, no stream of their own, no admission claim."""
    doors = service_permissions(DOORS)
    monitoring = set(monitoring_subjects())
    assert set(doors.publish) - monitoring == {
        "agent.request.*", "agent.feedback.*", "agent.replay.*"}
    assert not [p for p in doors.publish if p.startswith("$JS.") and p not in monitoring]
    assert set(doors.subscribe) == {
        "agent.response.*.*", "agent.response.*._feedback.*", "_INBOX.intentroute-doors.>",
        "$SRV.PING", "$SRV.INFO", "$SRV.STATS", "$SRV.*.intentroute-doors",
        "$SRV.*.intentroute-doors.*"}
    assert doors.allow_responses
    assert doors.max_responses == 1
    # ... which the gateway no longer holds: it admits, it does not ask.
    gateway = service_permissions("gateway")
    assert "agent.request.*" not in gateway.publish
    assert not [s for s in gateway.subscribe if s.startswith("agent.response")]
    # Of the dashboard's services-API reads it keeps the stages' stats only (what their
    # replicas hold: admission leaves a dead replica's messages out).
    assert monitoring & {p for p in gateway.publish if p.startswith("$SRV")} == {
        "$SRV.STATS"}
    # The learner's job is Postgres's: on the bus, the services API under its name only.
    learner = service_permissions(LEARNER)
    assert learner.publish == ()
    assert set(learner.subscribe) == {
        "_INBOX.intentroute-learner.>", "$SRV.PING", "$SRV.INFO", "$SRV.STATS",
        "$SRV.*.intentroute-learner", "$SRV.*.intentroute-learner.*"}


@pytest.mark.parametrize("worker", list(NATS_WORKERS))
def test_a_worker_listens_on_the_services_api_under_its_own_name_only(worker: str) -> None:
    own = f"intentroute-{worker}"
    srv = {s for s in service_permissions(worker).subscribe if s.startswith("$SRV")}
    assert srv == {"$SRV.PING", "$SRV.INFO", "$SRV.STATS", f"$SRV.*.{own}", f"$SRV.*.{own}.*"}
    # The name nats.micro registers under is the user's name.
    from shared.runtime.micro import service_name

    assert service_name(worker) == own


def test_the_ops_reader_reads_and_changes_nothing() -> None:
    perms = ops_permissions()
    assert perms.subscribe == ("_INBOX.intentroute-ops.>",)
    assert not perms.allow_responses
    for subject in perms.publish:
        assert subject.startswith(("$SRV.PING", "$SRV.INFO", "$SRV.STATS",
                                   "$JS.API.CONSUMER.INFO.", "$JS.API.STREAM.INFO.",
                                   "$JS.API.CONSUMER.LIST.")), subject
    for grant in WORKER_GRANTS.values():
        lag = (f"$JS.API.CONSUMER.LIST.{grant.stream}" if grant.per_agent  # summed
               else f"$JS.API.CONSUMER.INFO.{grant.stream}.{grant.durable}")
        assert lag in perms.publish
    assert "$JS.API.STREAM.INFO.INTENTROUTE_DLQ" in perms.publish
    assert agent_id_problem(OPS_USER)  # never an agent's name


def test_stage_hand_offs_follow_the_pipeline() -> None:
    def stage_publishes(worker: str) -> set[str]:
        return {p for p in service_permissions(worker).publish
                if p.startswith("intentroute.stage.")}

    assert stage_publishes("gateway") == {"intentroute.stage.classify"}
    assert stage_publishes("classifier") == {"intentroute.stage.retrieve",
                                             "intentroute.stage.generate.*"}
    assert stage_publishes("retriever") == {"intentroute.stage.generate.main",
                                            "intentroute.stage.generate.conversational"}
    # A split message's next part goes to its first stage from the stage that ended
    # the part before it (shared.runtime.message_parts): the retriever or a generator.
    next_part = {"intentroute.stage.retrieve", "intentroute.stage.generate.main",
                 "intentroute.stage.generate.conversational"}
    assert stage_publishes("generator-main") == {"intentroute.stage.validate", *next_part}
    assert stage_publishes("generator-conversational") == next_part
    assert stage_publishes("validator") == next_part
    # Every stage reads the last stored chunk of an answer (a redelivered message whose
    # answer already went out is dropped) by its subject only, never a stream by
    # sequence, and dead-letters only on its own consumers' subjects (the row writer
    # every worker runs included).
    for worker, grant in WORKER_GRANTS.items():
        publish = service_permissions(worker).publish
        assert "$JS.API.DIRECT.GET.AGENT_RESPONSES.agent.response.*.*" in publish
        assert not [p for p in publish if ".MSG.GET." in p or p.endswith(".DIRECT.GET.>")
                    or p.rstrip(".>").endswith(("DIRECT.GET", "DIRECT.GET.AGENT_RESPONSES",
                                                "DIRECT.GET.ANSWER_CLAIMS"))]
        assert {p for p in publish if p.startswith("intentroute.dlq.")} == {
            f"intentroute.dlq.{d}" for d in (grant.durable, *(c.durable for c in grant.consumers),
                                             "row-writer")}


def test_only_the_gateway_reads_feedback_and_acknowledges_it() -> None:
    feedback_consumer = set(consumer_grants("AGENT_FEEDBACK", "gateway-feedback",
                                            "agent.feedback.*"))
    gateway = set(service_permissions("gateway").publish)
    assert feedback_consumer <= gateway
    assert "agent.response.*._feedback.*" in gateway
    assert "$JS.API.STREAM.INFO.AGENT_FEEDBACK" in gateway
    for worker in WORKER_GRANTS:
        if worker == "gateway":
            continue
        publish = service_permissions(worker).publish
        assert not feedback_consumer & set(publish), worker
        assert not any("_feedback" in p or p.startswith("agent.feedback") for p in publish)
    # An agent publishes its own feedback only and reads its acks with its responses.
    alice = agent_permissions("alice")
    assert [p for p in alice.publish if p.startswith("agent.feedback")] == [
        "agent.feedback.alice"]
    assert "agent.response.alice.>" in alice.subscribe


def test_only_the_gateway_serves_replays_through_one_answer_consumers() -> None:
    from services.gateway.replay_service import ReplayService  # noqa: F401  (the server side)

    gateway = service_permissions("gateway")
    assert "agent.replay.*" in gateway.subscribe
    # Creation names the consumer and filters it to one agent's answer subject.
    assert "$JS.API.CONSUMER.CREATE.AGENT_RESPONSES.*.agent.response.*.*" in gateway.publish
    for worker in WORKER_GRANTS:
        if worker != "gateway":
            perms = service_permissions(worker)
            assert "agent.replay.*" not in perms.subscribe
            assert not any(p.startswith("$JS.API.CONSUMER.CREATE.AGENT_RESPONSES")
                           for p in perms.publish), worker


def test_the_feedback_consumer_is_the_one_granted() -> None:
    from services.gateway.feedback_recorder import build_feedback_consumer
    from shared.runtime.consumer import StageSpec

    spec: StageSpec = build_feedback_consumer(CommonSettings(), max_inflight=4).spec
    config = spec.consumer_config()
    create = (f"$JS.API.CONSUMER.CREATE.{spec.stream}.{config.name}."
              f"{config.filter_subject}")
    assert create in service_permissions("gateway").publish


def _service_specs() -> dict[str, tuple[str, str, str]]:
    from services.classifier.handlers import build_stage as classifier
    from services.classifier.settings import ClassifierSettings
    from services.gateway.handlers import build_stage as gateway
    from services.gateway.settings import GatewaySettings
    from services.generator.handlers import build_stage as generator
    from services.generator.settings import GeneratorSettings
    from services.retriever.handlers import build_stage as retriever
    from services.retriever.settings import RetrieverSettings
    from services.validator.handlers import build_stage as validator
    from services.validator.settings import ValidatorSettings

    stages: dict[str, Any] = {
        "gateway": gateway(GatewaySettings.from_env({})),
        "classifier": classifier(ClassifierSettings.from_env({})),
        "retriever": retriever(RetrieverSettings.from_env({})),
        "generator-main": generator(GeneratorSettings.from_env({}, slot=ModelSlot.MAIN)),
        "generator-conversational": generator(
            GeneratorSettings.from_env({}, slot=ModelSlot.CONVERSATIONAL)),
        "validator": validator(ValidatorSettings.from_env({})),
    }
    # The gateway's per-agent consumers: tests/unit/test_fair_share.py.
    return {w: (s.spec.stream, s.spec.durable, s.spec.subject) for w, s in stages.items()
            if not s.spec.per_agent}


@pytest.mark.parametrize(("worker", "spec"), list(_service_specs().items()))
def test_each_worker_may_create_exactly_the_consumer_its_stage_declares(
    worker: str, spec: tuple[str, str, str]
) -> None:
    stream, durable, subject = spec
    perms = service_permissions(worker)  # as deployed (today's subjects included)
    create, info, pull, ack = consumer_grants(stream, durable, subject)
    assert {create, info, pull, ack} <= set(perms.publish)
    # ... and the subject nats-py sends for that config is the granted one.
    from shared.runtime.consumer import StageSpec

    config = StageSpec(stream=stream, subject=subject, durable=durable, max_inflight=1,
                       ack_wait=1, max_deliver=1).consumer_config()
    assert f"$JS.API.CONSUMER.CREATE.{stream}.{config.name}.{config.filter_subject}" == create


def test_the_auth_part_lists_every_user_with_quoted_hashes() -> None:
    text = auth_config(stack_users(HASHES, [("alice", "$2b$10$alice")]))
    users = _users(text)
    assert set(users) == {ADMIN_USER, OPS_USER, *SERVICE_USERS, "alice"}
    assert "permissions" not in users[ADMIN_USER]
    assert "allow_responses" not in users[OPS_USER]["permissions"]
    assert users["alice"]["password"] == "$2b$10$alice"
    assert "allow_responses" not in users["alice"]["permissions"]
    # The gateway answers a replay with one reply per chunk; the other workers with one.
    assert users["intentroute-gateway"]["permissions"]["allow_responses"] == {
        "max": REPLAY_MAX_REPLIES, "expires": f"{REPLAY_REPLY_SECONDS:g}s"}
    assert users["intentroute-classifier"]["permissions"]["allow_responses"] is True
    assert re.search(r'"password": "\$2b\$10\$alice"', text)  # never an unquoted `$`
    assert "no_auth_user" not in text


def test_each_agent_is_alone_in_its_account_importing_only_its_own_subjects() -> None:
    accounts = _auth_json(auth_config(stack_users(
        HASHES, [("alice", "$2b$10$alice"), ("bob", "$2b$10$bob")])))
    assert set(accounts) == {APP_ACCOUNT, "alice", "bob"}
    app = accounts[APP_ACCOUNT]
    # The streams and the stack's users are in the stack's account only.
    assert app["jetstream"] == "enabled"
    assert "jetstream" not in accounts["alice"]
    assert {u["user"] for u in app["users"]} == set(STACK_USERS)
    assert [u["user"] for u in accounts["alice"]["users"]] == ["alice"]
    imported = {(kind, body["subject"]) for entry in accounts["alice"]["imports"]
                for kind, body in entry.items()}
    assert imported == {("service", "agent.request.alice"), ("service", "agent.feedback.alice"),
                        ("service", "agent.replay.alice"), ("stream", "agent.response.alice.>")}
    assert all(body["account"] == APP_ACCOUNT for entry in accounts["bob"]["imports"]
               for body in entry.values())
    # Replays answer with many messages, within the gateway's own bounds.
    replay = next(e for e in app["exports"] if e.get("service") == "agent.replay.*")
    assert replay == {"service": "agent.replay.*", "response_type": "stream",
                      "response_threshold": f"{REPLAY_REPLY_SECONDS:g}s"}
    assert account_names(auth_config(stack_users(HASHES, [("carol", "h")]))) == {
        APP_ACCOUNT, "carol"}


def test_agents_with_reserved_or_malformed_ids_are_left_out() -> None:
    users = stack_users(HASHES, [("admin", "h"), ("intentroute-gateway", "h"), ("a.b", "h"),
                                 ("ok_agent-1", "h")])
    assert [u.name for u in users if u.name not in HASHES] == ["ok_agent-1"]
    with pytest.raises(ValueError, match="duplicate"):
        auth_config([User("x", "h", None), User("x", "h", None)])


def test_the_server_part_includes_auth_and_tls() -> None:
    text = server_config(host="127.0.0.1", port=4222, store_dir="/s", pid_file="/p",
                         tls=ServerTls("/c.pem", "/k.pem", ca="/ca.pem"))
    assert 'include "auth.conf"' in text
    tls = json.loads(text.split("tls: ", 1)[1].split("\ninclude")[0])
    assert tls == {"cert_file": "/c.pem", "key_file": "/k.pem", "timeout": 5,
                   "ca_file": "/ca.pem", "verify": True}
    open_server = server_config(host="127.0.0.1", port=4222, store_dir="/s", pid_file="/p",
                                auth=False)
    assert "include" not in open_server
    assert "tls" not in open_server


@pytest.mark.parametrize(("agent_id", "ok"), [
    ("alice", True), ("A_b-9", True), ("x" * 64, True), ("x" * 65, False), ("", False),
    ("a.b", False), ("a>", False), ("admin", False), ("intentroute", False),
    ("IntentRoute-x", False), ("administrator", True),
])
def test_agent_ids(agent_id: str, ok: bool) -> None:
    assert (agent_id_problem(agent_id) == "") is ok


def test_a_token_splits_at_the_first_dot() -> None:
    assert split_token("alice.se.cret") == ("alice", "se.cret")
    assert split_token("nodot") == ("nodot", "")


def test_connect_kwargs_from_settings(tmp_path: Path) -> None:
    common = CommonSettings(nats_user="intentroute-retriever", nats_password="pw")
    assert connect_kwargs(common) == {"user": "intentroute-retriever", "password": "pw",
                                      "inbox_prefix": "_INBOX.intentroute-retriever"}
    assert connect_kwargs(CommonSettings(nats_token="t")) == {"token": "t"}
    assert connect_kwargs(CommonSettings()) == {}
    assert connect_kwargs(CommonSettings(nats_creds="/x.creds", nats_inbox_prefix="_I.x")) == {
        "user_credentials": "/x.creds", "inbox_prefix": "_I.x"}
    assert CommonSettings.from_env({"NATS_USER": "u", "NATS_PASSWORD": "p"}).nats_authenticated
    assert not CommonSettings.from_env({}).nats_authenticated


def test_the_broker_gets_the_same_credentials() -> None:
    from faststream.nats.security import NatsCredentials, NatsToken, NatsUserPassword

    ctx = ssl.create_default_context()
    user = broker_security({"user": "u", "password": "p", "tls": ctx})
    assert isinstance(user, NatsUserPassword)
    assert user.username == "u"
    assert user.ssl_context is ctx
    assert isinstance(broker_security({"token": "t"}), NatsToken)
    assert isinstance(broker_security({"user_credentials": "/x.creds"}), NatsCredentials)
    assert broker_security({}) is None


def test_trust_rules_become_scram() -> None:
    hba = ("# TYPE DATABASE USER ADDRESS METHOD\n"
           "# local all all trust\n"
           "local   all             all                                     trust\n"
           "host    all             all             127.0.0.1/32            trust\n"
           "host    replication     all             ::1/128                 trust  # x\n")
    assert hba_uses_trust(hba)
    converted = hba_to_scram(hba)
    assert not hba_uses_trust(converted)
    assert "# local all all trust" in converted  # comments untouched
    assert converted.count("scram-sha-256") == 3
