"""The gRPC face against real workers: the final response's routing decision as a
message (and the same as its JSON string for old clients), the caller's `timeout_ms`
shortening the pipeline's deadline (a final DEADLINE_EXCEEDED), and a request id in
flight already refused (ALREADY_EXISTS)."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import grpc
import pytest
from google.protobuf.json_format import MessageToDict

from shared.grpc import agent_pb2, agent_pb2_grpc
from tests.helpers.pipeline import base_env, gateway, running

pytestmark = pytest.mark.integration

# PLATFORM by the RC-02 rules (platform data in extra_context): no retriever needed.
WORKERS = ("gateway", "classifier", "generator-conversational", "doors")


async def test_grpc_decision_message_and_timeout_ms(
    nats_url: str, database_url: str, agent_tokens: dict[str, str], tmp_path: Path
) -> None:
    from intentroute.stack import free_port

    port = free_port()
    env = base_env(nats_url, database_url, tmp_path, GATEWAY_GRPC_LISTEN=f"127.0.0.1:{port}")
    auth = (("authorization", f"Bearer {agent_tokens['grpc']}"),)
    session = f"g-{uuid.uuid4().hex[:8]}"
    async with running(env, WORKERS), grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = agent_pb2_grpc.AssistanceEngineStub(channel)
        answered = [r async for r in stub.AskAgentStream(agent_pb2.AgentRequest(
            query="what is my quota usage? 80% of my plan", session_id=session,
            extra_context="quota_used=80%", timeout_ms=60_000), metadata=auth)]
        # 1 ms is gone before the classifier can look at the request.
        late = [r async for r in stub.AskAgentStream(agent_pb2.AgentRequest(
            query="what is my quota usage? 80% of my plan", session_id=session,
            extra_context="quota_used=80%", timeout_ms=1), metadata=auth)]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.AskAgent(agent_pb2.AgentRequest(
                query="q", session_id=session, timeout_ms=86_400_001), metadata=auth)

    final = answered[-1]
    assert final.is_final
    assert not final.error_code
    assert final.HasField("decision")
    assert (final.decision.type, final.decision.layer) == ("PLATFORM", "rules")
    assert final.decision.model_slot == "conversational"
    assert MessageToDict(final.decision, preserving_proto_field_name=True,
                         always_print_fields_with_no_presence=True) == json.loads(
        final.decision_json)
    assert not any(r.HasField("decision") for r in answered[:-1])

    assert late[-1].is_final
    assert late[-1].error_code == "DEADLINE_EXCEEDED"

    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "timeout_ms" in (refused.value.details() or "")


async def test_a_request_id_in_flight_already_is_already_exists(
    nats_url: str, database_url: str, agent_tokens: dict[str, str], tmp_path: Path
) -> None:
    # The gateway alone: no classifier takes the requests, so each waits in flight. Two
    # of one id: whichever comes second is refused before anything is published; the
    # other ends once its own timeout_ms (and the door's grace) is over, not after the
    # door's 120 s.
    auth = (("authorization", f"Bearer {agent_tokens['grpc']}"),)
    rid = f"dup-{uuid.uuid4().hex[:8]}"
    async with gateway(nats_url, database_url, tmp_path) as (grpc_addr, _), \
            grpc.aio.insecure_channel(grpc_addr) as channel:
        stub = agent_pb2_grpc.AssistanceEngineStub(channel)

        async def ask() -> list[agent_pb2.AgentResponse] | grpc.StatusCode:
            try:
                return [r async for r in stub.AskAgentStream(agent_pb2.AgentRequest(
                    query="how do I loop?", session_id=rid, request_id=rid,
                    timeout_ms=3_000), metadata=auth)]
            except grpc.aio.AioRpcError as exc:
                return exc.code()

        first = asyncio.create_task(ask())
        await asyncio.sleep(0.5)
        outcomes = [await ask(), await asyncio.wait_for(first, 30)]

    assert sorted(map(str, outcomes)) == sorted(
        map(str, (grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.DEADLINE_EXCEEDED)))
