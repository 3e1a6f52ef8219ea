"""Contract tier, gateway: `agent.request.<agent>` wire bytes in, a hand-off or an error
answer out; the agent is the subject's."""

from __future__ import annotations

import json

from opentelemetry.trace import NoOpTracer

from services.gateway.handlers import GatewayDeps, build_stage
from services.gateway.settings import GatewaySettings
from shared.auth.ports import AgentInfo
from shared.contracts.codec import decode_admitted, decode_chunk, encode
from shared.contracts.request import AgentRequest
from testkit.fakes import FakeAgents, FakeStore, RecordingBus, feedback_recorder
from testkit.wire import ADMISSION, COMMON, run_on_wire


def setup(*agents: AgentInfo) -> tuple[RecordingBus, FakeStore, GatewayDeps]:
    bus, store = RecordingBus(), FakeStore()
    deps = GatewayDeps(bus=bus, store=store, tracer=NoOpTracer(), admission=ADMISSION,
                       agents=FakeAgents(*agents or (AgentInfo("a"),)),
                       feedback=feedback_recorder())
    return bus, store, deps


def from_agent(agent: str) -> str:
    """The subject `agent`'s requests arrive on."""
    return f"agent.request.{agent}"


async def test_gateway_forwards_valid_and_answers_invalid() -> None:
    stage = build_stage(GatewaySettings(common=COMMON))
    assert (stage.spec.stream, stage.spec.subject) == ("AGENT_REQUESTS", "agent.request.*")
    bus, store, deps = setup()
    ok = AgentRequest(request_id="ok-1", session_id="s", agent_id="a", query="hi")
    await run_on_wire(stage, encode(ok), deps, subject=from_agent("a"))
    bad = {"request_id": "bad-1", "session_id": "s", "agent_id": "a", "query": "q",
           "query_type": "NOPE"}
    await run_on_wire(stage, json.dumps(bad).encode(), deps, subject=from_agent("a"))

    forwarded = [(subj, stream) for subj, stream in bus.subjects()
                 if subj.startswith("intentroute")]
    assert forwarded == [("intentroute.stage.classify", "INTENTROUTE_PIPELINE")]
    ((_, _, msg_id, payload),) = [s for s in bus.sent if s[0] == "intentroute.stage.classify"]
    admitted = decode_admitted(payload)
    assert msg_id == f"a:ok-1:{admitted.run}:accepted"  # the run: see the OpenAI door's test
    assert admitted.request == ok
    assert not admitted.trusted
    (error,) = bus.on("agent.response.a.bad-1")
    chunk = decode_chunk(error)
    assert chunk.is_final
    assert chunk.error is not None
    assert chunk.error.code == "UNKNOWN_QUERY_TYPE"
    assert len(store.rows) == 1


async def test_the_agent_comes_from_the_subject_and_its_record() -> None:
    stage = build_stage(GatewaySettings(common=COMMON))
    bus, _, deps = setup(AgentInfo("ide", trusted=True))
    body = {"request_id": "r-1", "session_id": "s", "query": "hi", "query_type": "PLATFORM"}
    await run_on_wire(stage, json.dumps(body).encode(), deps, subject=from_agent("ide"))
    admitted = decode_admitted(bus.on("intentroute.stage.classify")[0])
    assert admitted.request.agent_id == "ide"
    assert admitted.trusted


async def test_a_body_claiming_another_agent_is_refused() -> None:
    stage = build_stage(GatewaySettings(common=COMMON))
    bus, _, deps = setup(AgentInfo("mallory"), AgentInfo("alice"))
    body = {"request_id": "r-2", "session_id": "s", "agent_id": "alice",
            "query": "repeat your last answer"}
    await run_on_wire(stage, json.dumps(body).encode(), deps, subject=from_agent("mallory"))
    assert bus.on("intentroute.stage.classify") == []
    assert bus.on("agent.response.alice.r-2") == []
    (chunk,) = bus.chunks("r-2", agent_id="mallory")
    assert chunk.error is not None
    assert chunk.error.code == "AGENT_MISMATCH"


async def test_a_revoked_or_unknown_agent_is_answered_not_admitted() -> None:
    stage = build_stage(GatewaySettings(common=COMMON))
    bus, _, deps = setup(AgentInfo("gone", revoked=True))
    for agent in ("gone", "nobody"):
        body = {"request_id": f"r-{agent}", "session_id": "s", "query": "hi"}
        await run_on_wire(stage, json.dumps(body).encode(), deps, subject=from_agent(agent))
        (chunk,) = bus.chunks(f"r-{agent}", agent_id=agent)
        assert chunk.error is not None
        assert chunk.error.code == "UNKNOWN_AGENT"
    assert bus.on("intentroute.stage.classify") == []


async def test_gateway_answers_unreadable_input_on_the_agents_invalid_subject() -> None:
    bus, store, deps = setup()
    await run_on_wire(build_stage(GatewaySettings(common=COMMON)), b"{not json", deps,
                      subject=from_agent("a"))
    (payload,) = bus.on("agent.response.a._invalid")
    chunk = decode_chunk(payload)
    assert chunk.is_final
    assert chunk.error is not None
    assert chunk.error.code == "MALFORMED_JSON"
    assert store.rows == []


async def test_a_refused_request_ends_in_its_typed_final_chunk_and_log_row() -> None:
    from services.gateway.limits.gate import LimitGate
    from services.gateway.limits.ports import Admission, Verdict
    from services.gateway.limits.settings import LimitSettings
    from shared.store.rows import RequestLogRow
    from testkit.fakes import FakeLimits, FakePolicies

    stage = build_stage(GatewaySettings(common=COMMON))
    bus, store, deps = setup()
    limits = FakeLimits(Admission(verdict=Verdict.RATE_LIMITED, retry_after_ms=250),
                        Admission(verdict=Verdict.DEGRADE))
    deps.limits = LimitGate(limits, FakePolicies(), LimitSettings(rate=1000.0, max_inflight=512))
    refused = AgentRequest(request_id="r-1", session_id="s", agent_id="a", query="hi")
    degraded = AgentRequest(request_id="r-2", session_id="s", agent_id="a", query="hi")
    for req in (refused, degraded):
        await run_on_wire(stage, encode(req), deps, subject=from_agent("a"))

    (final,) = (decode_chunk(c) for c in bus.on("agent.response.a.r-1"))
    assert final.is_final
    assert final.error is not None
    assert (final.error.code, final.error.retry_after_ms) == ("RATE_LIMITED", 250)
    assert [(r.request_id, r.outcome) for r in store.rows
            if isinstance(r, RequestLogRow)] == [("r-1", "error:RATE_LIMITED")]
    assert len(store.rows) == 1
    # Past a budget with on_budget=degrade: handed on, marked for the generator.
    (handoff,) = [s for s in bus.sent if s[0] == "intentroute.stage.classify"]
    admitted = decode_admitted(handoff[3])
    assert (admitted.request.request_id, admitted.degraded) == ("r-2", True)
    assert [c["request_id"] for c in limits.calls] == ["r-1", "r-2"]


async def test_a_request_id_is_admitted_once_and_never_answered_twice() -> None:
    """The same request id sent again (as a new message: another stream sequence) is not
    run: DUPLICATE_REQUEST on the agent's `_invalid` subject, a row of its own (no
    envelope time: it never meets the answered row); a redelivery of the admitted
    message is the same run and goes on."""
    stage = build_stage(GatewaySettings(common=COMMON))
    bus, store, deps = setup()
    first = AgentRequest(request_id="r-9", session_id="s", agent_id="a", query="hi")
    await run_on_wire(stage, encode(first), deps, subject=from_agent("a"), stream_seq=5)
    await run_on_wire(stage, encode(first), deps, subject=from_agent("a"), stream_seq=5,
                      deliveries=2)
    assert len(bus.on("intentroute.stage.classify")) == 2  # the run, handed on again
    again = AgentRequest(request_id="r-9", session_id="s", agent_id="a", query="other")
    await run_on_wire(stage, encode(again), deps, subject=from_agent("a"), stream_seq=6)
    # The id's subject got nothing; the refusal names the id on `_invalid`.
    assert bus.on("agent.response.a.r-9") == []
    (refusal,) = [decode_chunk(p) for p in bus.on("agent.response.a._invalid")]
    assert refusal.request_id == "r-9"
    assert refusal.error is not None
    assert refusal.error.code == "DUPLICATE_REQUEST"
    assert len(bus.on("intentroute.stage.classify")) == 2
    (row,) = store.rows
    assert (row.request_id, row.outcome, row.created_at) == (
        "r-9", "error:DUPLICATE_REQUEST", None)


async def test_malformed_input_naming_an_admitted_id_goes_to_invalid() -> None:
    """A body that does not pass the checks but carries an admitted request id (the
    trick that erased an answered row) is answered on `_invalid`, never on the id's
    subject, which already has its final chunk."""
    stage = build_stage(GatewaySettings(common=COMMON))
    bus, store, deps = setup()
    ok = AgentRequest(request_id="r-3", session_id="s", agent_id="a", query="hi")
    await run_on_wire(stage, encode(ok), deps, subject=from_agent("a"), stream_seq=1)
    await run_on_wire(stage, b'{"request_id": "r-3"}', deps, subject=from_agent("a"),
                      stream_seq=2)
    assert bus.on("agent.response.a.r-3") == []
    (refusal,) = [decode_chunk(p) for p in bus.on("agent.response.a._invalid")]
    assert refusal.error is not None
    assert (refusal.request_id, refusal.error.code) == ("r-3", "MISSING_FIELD")
    (row,) = store.rows
    assert (row.outcome, row.created_at) == ("error:MISSING_FIELD", None)
    # A new id's malformed body is answered on its own subject, and uses the id up.
    await run_on_wire(stage, b'{"request_id": "r-4"}', deps, subject=from_agent("a"),
                      stream_seq=3)
    (error,) = bus.on("agent.response.a.r-4")
    assert decode_chunk(error).is_final


async def test_a_model_the_agents_policy_does_not_list_is_refused_before_any_work() -> None:
    from shared.policy.agent import AgentPolicy
    from shared.store.rows import RequestLogRow
    from testkit.fakes import FakePolicies

    stage = build_stage(GatewaySettings(common=COMMON))
    bus, store, deps = setup(AgentInfo("a"), AgentInfo("b"))
    deps.policies = FakePolicies({"a": AgentPolicy(models=["cloud/big-1"])})
    for agent, request_id in (("a", "ok"), ("b", "not-b"), ("a", "other")):
        model = "cloud/small" if request_id == "other" else "cloud/big-1"
        req = AgentRequest(request_id=request_id, session_id="s", query="hi", model=model)
        await run_on_wire(stage, encode(req), deps, subject=from_agent(agent))
    (handoff,) = bus.on("intentroute.stage.classify")
    assert decode_admitted(handoff).request.model == "cloud/big-1"
    for agent, request_id in (("b", "not-b"), ("a", "other")):
        (chunk,) = bus.chunks(request_id, agent_id=agent)
        assert chunk.error is not None
        assert chunk.error.code == "UNKNOWN_MODEL"
        assert "may choose" in chunk.error.message
    assert sorted(r.outcome for r in store.rows if isinstance(r, RequestLogRow)) == [
        "error:UNKNOWN_MODEL", "error:UNKNOWN_MODEL"]
