"""The gRPC face's newer fields: `timeout_ms` reaches the contract's request (and is
checked by its rules), the routing decision rides on the final response both as the old
JSON string and as a `RoutingDecision` message holding the same values."""

from __future__ import annotations

import json

from google.protobuf.json_format import MessageToDict

from services.doors.grpc_server import to_request, to_response
from shared.contracts.checks import check_request
from shared.contracts.errors import InvalidInputError as InputError
from shared.contracts.request import MAX_TIMEOUT_MS
from shared.contracts.response import ChunkKind, ErrorCode, ErrorInfo, ResponseChunk
from shared.contracts.routing import (
    Alternative,
    Clarity,
    Layer,
    ModelSlot,
    QueryType,
    RoutingDecision,
)
from shared.grpc import agent_pb2

DECISION = RoutingDecision(type=QueryType.CODE_GENERATION, layer=Layer.LLM, confidence=0.625,
                           model_slot=ModelSlot.MAIN, clarity=Clarity.MULTI_INTENT,
                           alternatives=[Alternative(QueryType.RETRIEVAL, 0.25),
                                         Alternative(QueryType.PLATFORM, 0.125)],
                           resolved_reference=True, declared_ignored=True,
                           history_unavailable=True)


def test_timeout_ms_reaches_the_request_and_is_checked_like_a_nats_one() -> None:
    req = to_request(agent_pb2.AgentRequest(query="q", session_id="s", timeout_ms=1500))
    assert req.timeout_ms == 1500
    assert to_request(agent_pb2.AgentRequest(query="q", session_id="s")).timeout_ms == 0
    too_long = to_request(agent_pb2.AgentRequest(query="q", session_id="s",
                                                 timeout_ms=MAX_TIMEOUT_MS + 1))
    refused = check_request(too_long, "a1")
    assert isinstance(refused, InputError)
    assert refused.code == ErrorCode.INVALID_FIELD
    assert "timeout_ms" in refused.message


def test_final_response_carries_the_decision_as_a_message_and_as_json() -> None:
    final = to_response(ResponseChunk(request_id="r", seq=3, kind=ChunkKind.FINAL,
                                      is_final=True, query_type="CODE_GENERATION",
                                      decision=DECISION))
    assert final.HasField("decision")
    structured = MessageToDict(final.decision, preserving_proto_field_name=True,
                               always_print_fields_with_no_presence=True)
    assert structured == json.loads(final.decision_json)
    assert final.decision.alternatives[1].type == "PLATFORM"
    assert final.decision.layer == "llm"


def test_a_response_without_a_decision_has_neither_form() -> None:
    for chunk in (ResponseChunk(request_id="r", seq=0, text="partial"),
                  ResponseChunk(request_id="r", seq=0, kind=ChunkKind.FINAL, is_final=True,
                                error=ErrorInfo(ErrorCode.DEADLINE_EXCEEDED, "late"))):
        response = to_response(chunk)
        assert not response.HasField("decision")
        assert response.decision_json == ""
