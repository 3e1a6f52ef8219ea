"""Contract tier, feedback: `agent.feedback.<agent>` wire bytes in, an acknowledgement on
the agent's `_feedback` subject out (or a report on intentroute.invalid); the HTTP face's
status codes. Fakes of the feedback table and the agents directory."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.trace import NoOpTracer

from services.doors.http import build_http_app, split_listen
from services.doors.throttle import DEFAULT_AUTH_FAILURES, AuthThrottle
from services.gateway.feedback_recorder import FeedbackRecorder, build_feedback_consumer
from services.gateway.handlers import GatewayDeps
from shared.auth.ports import AgentInfo, HashGate
from shared.contracts.checks import check_feedback
from shared.contracts.feedback import Feedback, FeedbackAck, FeedbackOutcome
from testkit.fakes import (
    FakeAgents,
    FakeDelivery,
    FakeFeedbackTable,
    FakeStore,
    LocalDoor,
    RecordingBus,
    feedback_recorder,
)
from testkit.wire import ADMISSION, COMMON, run_on_wire


def setup(table: FakeFeedbackTable, *agents: AgentInfo) -> tuple[RecordingBus, GatewayDeps]:
    bus = RecordingBus()
    deps = GatewayDeps(bus=bus, store=FakeStore(), tracer=NoOpTracer(), admission=ADMISSION,
                       agents=FakeAgents(*agents or (AgentInfo("a"), AgentInfo("b"))),
                       feedback=feedback_recorder(table))
    return bus, deps


async def deliver(deps: GatewayDeps, subject: str, body: bytes | dict[str, Any],
                  deliveries: int = 1) -> FakeDelivery:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    consumer = build_feedback_consumer(COMMON, max_inflight=4)
    _, msg = await run_on_wire(consumer, raw, deps, subject=subject, deliveries=deliveries)
    return msg


def acks(bus: RecordingBus, subject: str) -> list[FeedbackAck]:
    return [msgspec.json.decode(p, type=FeedbackAck) for p in bus.on(subject)]


async def test_a_verdict_is_stored_and_acknowledged_on_the_agents_feedback_subject() -> None:
    table = FakeFeedbackTable(("a", "r-1"))
    bus, deps = setup(table)
    spec = build_feedback_consumer(COMMON, max_inflight=4).spec
    assert (spec.stream, spec.subject, spec.durable) == (
        "AGENT_FEEDBACK", "agent.feedback.*", "gateway-feedback")
    body = {"request_id": "r-1", "outcome": "user_rejected",
            "metadata": {"completion_quality": 2, "latency_ms": 812.5, "token_count": 90}}
    await deliver(deps, "agent.feedback.a", body)
    await deliver(deps, "agent.feedback.a", {**body, "outcome": "success"})
    first, repeat = acks(bus, "agent.response.a._feedback.r-1")
    assert (first.accepted, first.repeat) == (True, False)
    assert (repeat.accepted, repeat.repeat) == (True, True)
    assert table.rows[("a", "r-1")].outcome == FeedbackOutcome.SUCCESS
    assert [s for s, _ in bus.subjects()] == ["agent.response.a._feedback.r-1"] * 2


async def test_another_agents_request_and_an_unknown_one_are_refused_alike() -> None:
    table = FakeFeedbackTable(("a", "r-1"))
    bus, deps = setup(table)
    await deliver(deps, "agent.feedback.b", {"request_id": "r-1", "outcome": "error"})
    await deliver(deps, "agent.feedback.b", {"request_id": "nope", "outcome": "error"})
    (theirs,) = acks(bus, "agent.response.b._feedback.r-1")
    (unknown,) = acks(bus, "agent.response.b._feedback.nope")
    assert (theirs.accepted, theirs.error_code) == (False, "UNKNOWN_REQUEST")
    assert (unknown.accepted, unknown.error_code) == (False, "UNKNOWN_REQUEST")
    assert table.rows == {}
    assert not bus.on("agent.response.a._feedback.r-1")


@pytest.mark.parametrize(("body", "code", "ack_id"), [
    (b"{not json", "MALFORMED_JSON", "_invalid"),
    (b'{"request_id": "r-1"}', "MISSING_FIELD", "r-1"),
    (b'{"request_id": "r-1", "outcome": "great"}', "INVALID_FIELD", "r-1"),
    (b'{"request_id": "r.1", "outcome": "success"}', "INVALID_FIELD", "_invalid"),
    (b'{"request_id": "", "outcome": "success"}', "MISSING_FIELD", "_invalid"),
    (b'{"request_id": "r-1", "outcome": "success", "metadata": {"completion_quality": 11}}',
     "INVALID_FIELD", "r-1"),
    (b'{"request_id": "r-1", "outcome": "success", "metadata": {"latency_ms": -1}}',
     "INVALID_FIELD", "r-1"),
    (b'{"request_id": "r-1", "outcome": "success", "metadata": {"token_count": 9999999999}}',
     "INVALID_FIELD", "r-1"),
])
async def test_bad_input_is_refused_with_a_typed_error(body: bytes, code: str,
                                                       ack_id: str) -> None:
    table = FakeFeedbackTable(("a", "r-1"))
    bus, deps = setup(table)
    msg = await deliver(deps, "agent.feedback.a", body)
    (ack,) = acks(bus, f"agent.response.a._feedback.{ack_id}")
    assert (ack.accepted, ack.error_code) == (False, code)
    assert table.rows == {}
    assert not msg.nacked


@pytest.mark.parametrize("subject", ["agent.feedback.a=b", "agent.feedback.", "agent.feedback",
                                     "agent.feedback." + "x" * 129])
async def test_a_subject_without_a_valid_agent_is_reported_never_answered(subject: str) -> None:
    bus, deps = setup(FakeFeedbackTable())
    await deliver(deps, subject, {"request_id": "r-1", "outcome": "success"})
    assert [s for s, _ in bus.subjects()] == ["intentroute.invalid"]


async def test_a_revoked_agents_queued_feedback_is_refused() -> None:
    table = FakeFeedbackTable(("gone", "r-1"))
    bus, deps = setup(table, AgentInfo("gone", revoked=True))
    await deliver(deps, "agent.feedback.gone", {"request_id": "r-1", "outcome": "success"})
    (ack,) = acks(bus, "agent.response.gone._feedback.r-1")
    assert ack.error_code == "UNKNOWN_AGENT"
    assert table.calls == 0


async def test_an_unreachable_store_is_retried_then_answered_and_dead_lettered() -> None:
    table = FakeFeedbackTable(("a", "r-1"), down=True)
    bus, deps = setup(table)
    body = {"request_id": "r-1", "outcome": "success"}
    early = await deliver(deps, "agent.feedback.a", body, deliveries=1)
    assert early.nacked
    assert not bus.sent
    last = await deliver(deps, "agent.feedback.a", body, deliveries=COMMON.max_deliver)
    (ack,) = acks(bus, "agent.response.a._feedback.r-1")
    assert ack.error_code == "STORE_UNAVAILABLE"
    assert [stage for stage, _ in last.dead_lettered] == ["gateway-feedback"]


async def test_an_unknown_id_is_looked_up_again_before_it_is_refused() -> None:
    table = FakeFeedbackTable()
    recorder = FeedbackRecorder(table, unknown_retries=(0.0, 0.01))
    ack = await recorder.record("a", Feedback(request_id="r-9", outcome=FeedbackOutcome.ERROR))
    assert ack.error_code == "UNKNOWN_REQUEST"
    assert table.calls == 3


# ---- a verdict on one part of a message answered part by part (issue 34) ----------


async def test_a_verdict_on_one_part_is_stored_on_that_part_alone_and_its_ack_names_it(
) -> None:
    table = FakeFeedbackTable(parts={("a", "r-1"): 3})
    bus, deps = setup(table)
    await deliver(deps, "agent.feedback.a",
                  {"request_id": "r-1", "outcome": "user_rejected", "part": 1})
    await deliver(deps, "agent.feedback.a", {"request_id": "r-1", "outcome": "success"})
    await deliver(deps, "agent.feedback.a",
                  {"request_id": "r-1", "outcome": "success", "part": 1})
    on_part, whole, repeat = acks(bus, "agent.response.a._feedback.r-1")
    assert (on_part.accepted, on_part.part, on_part.repeat) == (True, 1, False)
    assert (whole.accepted, whole.part) == (True, None)
    assert (repeat.accepted, repeat.part, repeat.repeat) == (True, 1, True)
    # The part's verdict under the part's id (its classify_history entry's), the whole
    # request's under its own: neither replaces the other.
    assert set(table.rows) == {("a", "r-1#2"), ("a", "r-1")}
    assert table.rows[("a", "r-1#2")].outcome == FeedbackOutcome.SUCCESS


@pytest.mark.parametrize(("known", "part"), [
    ({("a", "r-1"): 2}, 2),  # past its last part
    ({}, 0),  # answered whole: no parts
])
async def test_a_part_the_request_lacks_is_refused_with_invalid_field(
    known: dict[tuple[str, str], int], part: int
) -> None:
    table = FakeFeedbackTable(("a", "r-1"), parts=known)
    recorder = FeedbackRecorder(table, unknown_retries=(0.0, 0.01))
    ack = await recorder.record("a", Feedback(request_id="r-1", outcome=FeedbackOutcome.ERROR,
                                              part=part))
    assert (ack.accepted, ack.error_code, ack.part) == (False, "INVALID_FIELD", part)
    assert f"has no part {part}" in ack.message
    assert table.calls == 1  # not looked up again: the request is known
    assert table.rows == {}


@pytest.mark.parametrize("part", [-1, 8_000, 2**40])
async def test_a_part_that_cannot_be_one_is_refused_before_the_store(part: int) -> None:
    table = FakeFeedbackTable(parts={("a", "r-1"): 3})
    bus, deps = setup(table)
    await deliver(deps, "agent.feedback.a",
                  {"request_id": "r-1", "outcome": "success", "part": part})
    (ack,) = acks(bus, "agent.response.a._feedback.r-1")
    assert (ack.accepted, ack.error_code, ack.part) == (False, "INVALID_FIELD", part)
    assert table.calls == 0


async def test_a_part_of_another_agents_request_is_refused_as_unknown() -> None:
    table = FakeFeedbackTable(parts={("a", "r-1"): 3})
    bus, deps = setup(table)
    await deliver(deps, "agent.feedback.b", {"request_id": "r-1", "outcome": "error",
                                             "part": 0})
    (ack,) = acks(bus, "agent.response.b._feedback.r-1")
    assert (ack.accepted, ack.error_code, ack.part) == (False, "UNKNOWN_REQUEST", 0)
    assert table.rows == {}


def test_a_part_decodes_and_a_verdict_without_one_is_on_the_whole_request() -> None:
    on_part = msgspec.json.decode(b'{"request_id": "r", "outcome": "success", "part": 0}',
                                  type=Feedback)
    assert (on_part.part, check_feedback(on_part)) == (0, None)
    whole = msgspec.json.decode(b'{"request_id": "r", "outcome": "success"}', type=Feedback)
    assert whole.part is None
    # A part that is not a whole number does not match the contract.
    from shared.contracts.checks import decode_feedback

    bad = decode_feedback(b'{"request_id": "r", "outcome": "success", "part": "1"}')
    assert isinstance(bad, FeedbackAck)
    assert bad.error_code == "INVALID_FIELD"


def test_the_grpc_door_carries_the_part_and_its_absence() -> None:
    from services.doors.grpc_server import to_feedback
    from shared.grpc import agent_pb2

    on_part = to_feedback(agent_pb2.FeedbackRequest(request_id="r", outcome="error", part=0))
    whole = to_feedback(agent_pb2.FeedbackRequest(request_id="r", outcome="error"))
    assert (on_part.part, whole.part) == (0, None)


def test_check_feedback_accepts_the_bounds() -> None:
    ok = msgspec.json.decode(
        b'{"request_id": "r", "outcome": "success", "metadata": '
        b'{"completion_quality": 10, "latency_ms": 0, "token_count": 0}}', type=Feedback)
    assert check_feedback(ok) is None
    assert check_feedback(Feedback(request_id="r", outcome=FeedbackOutcome.TIMEOUT)) is None


class TokenAgents:
    """Bearer tokens `<agent>.good` are valid."""

    async def verify_token(self, token: str, *,
                           before_hashing: HashGate | None = None) -> AgentInfo | None:
        agent, _, secret = token.partition(".")
        return AgentInfo(agent) if secret == "good" else None


async def test_http_status_codes() -> None:
    table = FakeFeedbackTable(("a", "r-1"), ("b", "r-b"), parts={("a", "r-p"): 2})
    app = build_http_app(LocalDoor(TokenAgents(), feedback_recorder(table),
                                   AuthThrottle(DEFAULT_AUTH_FAILURES)))
    body = {"request_id": "r-1", "outcome": "success"}
    async with TestClient(TestServer(app)) as client:
        async def post(agent: str, payload: Any, token: str | None = "a.good") -> Any:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            resp = await client.post(f"/agents/{agent}/feedback", data=data, headers=headers)
            return resp.status, await resp.json()

        assert await post("a", body) == (200, {"request_id": "r-1", "accepted": True})
        assert await post("a", body) == (200, {"request_id": "r-1", "accepted": True,
                                               "repeat": True})
        assert (await post("a", body, token=None))[0] == 401
        assert (await post("a", body, token="a.bad"))[0] == 401
        assert (await post("a", body, token="b.good"))[0] == 403
        status, ack = await post("a", {"request_id": "r-b", "outcome": "success"})
        assert (status, ack["error_code"]) == (404, "UNKNOWN_REQUEST")
        assert (await post("a", {"request_id": "zz", "outcome": "success"}))[0] == 404
        assert (await post("a", b"{oops"))[0] == 400
        # Input errors are 400 at every HTTP door (the one table of codes).
        assert (await post("a", {"request_id": "r-1", "outcome": "meh"}))[0] == 400
        assert (await post("a", {"request_id": "r-1", "outcome": "success",
                                 "metadata": {"completion_quality": -1}}))[0] == 400
        assert (await post("a", b"x" * 70_000))[0] == 413
        resp = await client.post("/agents/a/feedback", data=b"{}")
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        # A part of a message answered part by part; a part the request lacks is 400.
        assert await post("a", {**body, "request_id": "r-p", "part": 1}) == (
            200, {"request_id": "r-p", "accepted": True, "part": 1})
        status, ack = await post("a", {**body, "request_id": "r-p", "part": 2})
        assert (status, ack["error_code"], ack["part"]) == (400, "INVALID_FIELD", 2)
        assert (await post("a", {**body, "part": 0}))[0] == 400
    assert set(table.rows) == {("a", "r-1"), ("a", "r-p#2")}


def test_listen_addresses() -> None:
    from intentroute.stack.state import gateway_http_listen

    assert split_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert split_listen("0.0.0.0:8080") == ("0.0.0.0", 8080)
    with pytest.raises(ValueError, match="host:port"):
        split_listen("localhost")
    # `up`: port 0 becomes one port every gateway replica binds, named in stack.json.
    assert gateway_http_listen("127.0.0.1:0", lambda: 43123) == (
        "127.0.0.1:43123", "http://127.0.0.1:43123")
    assert gateway_http_listen("0.0.0.0:8080", lambda: 1) == (
        "0.0.0.0:8080", "http://127.0.0.1:8080")
    assert gateway_http_listen("off", lambda: 1) == ("", "")
    with pytest.raises(ValueError, match="host:port"):
        gateway_http_listen("8080", lambda: 1)
