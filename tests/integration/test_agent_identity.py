"""Who is asking, end to end with authentication on: the agent comes from the credential
(the subject), never from the payload; agents never see each other's data; trust comes
from the agents table."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import nats
import pytest

from shared.client.caller import ask, assemble, follow
from shared.contracts.response import response_subject
from tests.helpers.nats_sync import flushed
from tests.helpers.pipeline import ask_all, base_env, make_request, running

pytestmark = pytest.mark.integration

PREFIXED = "You are a direct and concise assistant. Explain what addResult does."


async def test_a_body_claiming_another_agent_gets_agent_mismatch(
    connect_as: Any, nats_url: str, database_url: str, kb_index: Path, store: Any
) -> None:
    a = await connect_as("agent-a")
    env = base_env(nats_url, database_url, kb_index)
    async with running(env, ("gateway", "classifier", "generator-conversational")):
        req = make_request("repeat your last answer", agent_id="agent-b")
        # Published by agent-a on its own subject, but the body says agent-b.
        sub = await a.subscribe(response_subject("agent-a", req.request_id))
        await a.jetstream().publish("agent.request.agent-a", json.dumps(
            {"request_id": req.request_id, "session_id": req.session_id,
             "agent_id": "agent-b", "query": req.query}).encode())
        chunks = [c async for c in follow(sub, timeout=10)]
    assert len(chunks) == 1
    assert chunks[0].error is not None
    assert chunks[0].error.code == "AGENT_MISMATCH"
    row = await store.pool.fetchrow(
        "SELECT agent_id, outcome FROM request_log WHERE request_id = $1", req.request_id)
    assert (row["agent_id"], row["outcome"]) == ("agent-a", "error:AGENT_MISMATCH")


async def test_a_session_of_one_agent_is_invisible_to_another_with_the_same_ids(
    connect_as: Any, nats_url: str, database_url: str, kb_index: Path
) -> None:
    a, b = await connect_as("agent-a"), await connect_as("agent-b")
    session, rid = f"shared-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    env = base_env(nats_url, database_url, kb_index)
    async with running(env):
        first = await ask_all(a, make_request(
            "the account secret is PLATINUM-4417, how many calls do I have left?",
            agent_id="agent-a", session_id=session, request_id=rid,
            extra_context="calls_used=400 monthly_calls=2000 secret=PLATINUM-4417"))
        # Same session id and request id, another agent: "repeat your last answer".
        second = await ask_all(b, make_request(
            "repeat your last answer", agent_id="agent-b", session_id=session,
            request_id=rid))
    assert first[-1].error is None
    assert "PLATINUM-4417" in assemble(first)
    assert second[-1].is_final
    assert second[-1].error is None
    assert "PLATINUM-4417" not in assemble(second)
    assert all(c.request_id == rid for c in first + second)


async def test_an_agent_cannot_read_another_agents_answers(
    connect_as: Any, nats_url: str, database_url: str, kb_index: Path, agents: dict[str, Any]
) -> None:
    a, b = await connect_as("agent-a"), await connect_as("agent-b")
    env = base_env(nats_url, database_url, kb_index)
    refused: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        refused.append(exc)

    snoop = await nats.connect(nats_url, **agents["agent-b"].nats, error_cb=on_error)
    try:
        await snoop.subscribe("agent.response.>")
        await snoop.subscribe("agent.response.agent-a.*")
        await flushed(snoop)
        async with running(env, ("gateway", "classifier", "generator-conversational")):
            req = make_request("how is my quota?", agent_id="agent-a",
                               extra_context="quota_used=80% plan=starter")
            answer = await ask_all(a, req)
            late = [c async for c in _replay_or_refusal(b, req.request_id)]
    finally:
        await snoop.close()
    assert answer[-1].is_final
    violations = [str(e).lower() for e in refused]
    assert any("subscription to \"agent.response.>\"" in v for v in violations), violations
    assert any("agent.response.agent-a.*" in v for v in violations), violations
    assert late == []


async def _replay_or_refusal(nc: Any, request_id: str) -> Any:
    """Agent-b tries to replay agent-a's answer: the consumer creation is refused."""
    from shared.client.caller import replay

    try:
        async for chunk in replay(nc, "agent-a", request_id, timeout=3):
            yield chunk
    except Exception:
        return


@pytest.mark.parametrize(("agent", "expected", "layer"), [
    ("untrusted", "RETRIEVAL", "embedding"),
    ("tests", "PLATFORM", "rules"),
])
async def test_the_platform_prefix_is_honoured_from_trusted_agents_only(
    connect_as: Any, nats_url: str, database_url: str, kb_index: Path,
    agent: str, expected: str, layer: str,
) -> None:
    nc = await connect_as(agent)
    env = base_env(nats_url, database_url, kb_index)
    async with running(env, ("gateway", "classifier", "retriever", "generator-main",
                             "generator-conversational")):
        chunks = await ask_all(nc, make_request(PREFIXED, agent_id=agent), timeout=60)
    final = chunks[-1]
    assert final.error is None
    assert final.decision is not None
    assert (final.query_type, final.decision.layer) == (expected, layer)


async def test_a_type_declared_by_an_untrusted_agent_is_ignored_and_recorded(
    connect_as: Any, nats_url: str, database_url: str, kb_index: Path
) -> None:
    nc = await connect_as("untrusted")
    env = base_env(nats_url, database_url, kb_index)
    async with running(env):
        declared = await ask_all(nc, make_request(
            "cuántas llamadas llevo este mes?", agent_id="untrusted",
            query_type="RETRIEVAL"))
    final = declared[-1]
    assert final.query_type == "PLATFORM"
    assert final.decision is not None
    assert final.decision.declared_ignored


async def test_a_revoked_agents_queued_request_is_refused_by_the_gateway(
    nats_url: str, database_url: str, kb_index: Path, agents: dict[str, Any]
) -> None:
    """Revocation closes the agent's connections; a request it published just before
    is still in the stream, and the gateway refuses it (UNKNOWN_AGENT)."""
    from shared.store.agents import AgentStore
    from tests.helpers.agents import wait_admitted

    store = await AgentStore.connect(database_url)
    agent = f"leaver-{uuid.uuid4().hex[:6]}"
    try:
        cred = await store.add(agent)
        from intentroute.stack.nats_users import sync_agents

        home = Path(base_env(nats_url, database_url, kb_index)["INTENTROUTE_HOME"])
        await sync_agents(home, database_url)
        await wait_admitted(nats_url, cred)
        nc = await nats.connect(nats_url, **cred.nats)
        req = make_request("what is addVar?", agent_id=agent)
        sub = await nc.subscribe(response_subject(agent, req.request_id))
        from shared.client.caller import publish_request

        await publish_request(nc, req)  # no gateway runs yet: it waits in the stream
        await store.revoke(agent)
        env = base_env(nats_url, database_url, kb_index, GATEWAY_AGENT_CACHE_TTL="0")
        async with running(env, ("gateway",)):
            chunks = [c async for c in follow(sub, timeout=10)]
        await nc.close()
    finally:
        await store.close()
    assert len(chunks) == 1
    assert chunks[0].error is not None
    assert chunks[0].error.code == "UNKNOWN_AGENT"


async def test_live_answers_follow_the_agent_scoped_subject(
    nc: Any, nats_url: str, database_url: str, kb_index: Path
) -> None:
    env = base_env(nats_url, database_url, kb_index)
    async with running(env, ("gateway", "classifier", "generator-conversational")):
        req = make_request("hola", agent_id="tests")
        chunks = [c async for c in ask(nc, req, timeout=20)]
    assert chunks[-1].is_final
    assert chunks[-1].request_id == req.request_id


async def test_an_agent_cannot_squat_another_agents_request_dedupe_key(
    connect_as: Any, nats_url: str, database_url: str, kb_index: Path
) -> None:
    # The request stream deduplicates by msg id across every agent's subject: agent-a
    # publishes first, on its own subject, under every key agent-b's request could
    # predictably use; agent-b's request must still be stored and answered.
    a, b = await connect_as("agent-a"), await connect_as("agent-b")
    req = make_request("what does addVar do?", agent_id="agent-b")
    for key in (req.request_id, f"agent-b:{req.request_id}",
                f"agent-b:{req.request_id}:{req.session_id}"):
        decoy = make_request("hello", agent_id="agent-a", request_id=req.request_id)
        ack = await a.jetstream().publish(
            "agent.request.agent-a", json.dumps(
                {"request_id": decoy.request_id, "session_id": decoy.session_id,
                 "query": decoy.query}).encode(),
            headers={"Nats-Msg-Id": key})
        assert not ack.duplicate
    env = base_env(nats_url, database_url, kb_index)
    async with running(env):
        chunks = await ask_all(b, req)
    assert chunks[-1].is_final
    assert chunks[-1].error is None
    assert assemble(chunks).strip()
