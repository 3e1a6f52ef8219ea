"""The committed AsyncAPI document and JSON Schemas (docs/asyncapi/) are what the code
generates, byte for byte; a message of every kind, built with the contracts and encoded
as on the wire, validates against its schema; the document holds together (every
reference resolves, every operation's messages are its channel's)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from typer.testing import CliRunner

from intentroute.cli import app
from intentroute.docs.asyncapi import document, render
from intentroute.docs.catalogue import CHANNELS, MESSAGES
from shared.contracts.codec import encode
from shared.contracts.feedback import Feedback, FeedbackAck, FeedbackMetadata, FeedbackOutcome
from shared.contracts.pipeline import Admitted, Passage, Routed, Usage
from shared.contracts.request import AgentRequest
from shared.contracts.response import (
    ChunkKind,
    ErrorCode,
    ErrorInfo,
    ResponseChunk,
    TokenUsage,
    ValidationStatus,
)
from shared.contracts.routing import (
    Alternative,
    Clarity,
    Layer,
    ModelSlot,
    QueryType,
    RoutingDecision,
)
from shared.runtime.row_queue import QueuedRows
from shared.store.rows import HistoryRow, RequestLogRow, TurnRow

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "asyncapi"
REGENERATE = "docs/asyncapi is out of date: run `intentroute docs asyncapi`"

DECISION = RoutingDecision(type=QueryType.CODE_GENERATION, layer=Layer.LLM, confidence=0.62,
                           model_slot=ModelSlot.MAIN, clarity=Clarity.NEEDS_CONFIRMATION,
                           alternatives=[Alternative(QueryType.RETRIEVAL, 0.3)],
                           resolved_reference=True)
REQUEST = AgentRequest(request_id="r1", session_id="s1", query="write a loop",
                       agent_id="a1", query_type="CODE_GENERATION", extra_context="plan=x",
                       user_info="u", editor_context="addVar(a, 1)", timeout_ms=2500)


def wire_messages() -> dict[str, list[bytes]]:
    """Messages of every JSON kind, as the code encodes them (shared/contracts/codec.py)."""
    routed = Routed(request=REQUEST, accepted_at=1_700_000_000.5, decision=DECISION,
                    passages=[Passage("d1", "Loops", "startLoop(i, 1, 10)", 0.8, "loops.md")],
                    answer="startLoop(i,1,3)\nendLoop()", answered_by="extractive",
                    parser_feedback="line 1: ...", attempt=1, seq=3, timings={"classify": 4.2},
                    admission="mac", deadline=1_700_000_030.0,
                    usage=Usage(model="m", tokens_in=10, tokens_out=5, compute_ms=12.5),
                    run="17", degraded=True)
    return {
        "AgentRequest": [encode(AgentRequest(request_id="r1", session_id="s1", query="q")),
                         encode(REQUEST)],
        "ResponseChunk": [
            encode(ResponseChunk(request_id="r1", seq=0, text="Use ")),
            encode(ResponseChunk(request_id="r1", seq=1, kind=ChunkKind.RESET)),
            encode(ResponseChunk(
                request_id="r1", seq=4, text="done", kind=ChunkKind.FINAL, is_final=True,
                query_type="CODE_GENERATION",
                validation_status=ValidationStatus.INVALID_UNRESOLVED, decision=DECISION,
                avap_code="addVar(a, 1)", answered_by="ollama:m", retried=True,
                usage=TokenUsage(tokens_in=3, tokens_out=4))),
            encode(ResponseChunk(
                request_id="r1", seq=0, kind=ChunkKind.FINAL, is_final=True,
                error=ErrorInfo(ErrorCode.RATE_LIMITED, "slow down", retry_after_ms=250))),
        ],
        "Feedback": [
            encode(Feedback(request_id="r1", outcome=FeedbackOutcome.USER_REJECTED)),
            encode(Feedback(request_id="r1", outcome=FeedbackOutcome.SUCCESS,
                            metadata=FeedbackMetadata(completion_quality=7.5, latency_ms=900.0,
                                                      token_count=42))),
        ],
        "FeedbackAck": [
            encode(FeedbackAck(request_id="r1", accepted=True, repeat=True)),
            encode(FeedbackAck(request_id="r1", accepted=False,
                               error_code=ErrorCode.UNKNOWN_REQUEST, message="no such")),
        ],
        "Admitted": [encode(Admitted(request=REQUEST, accepted_at=1_700_000_000.5,
                                     timings={"gateway": 1.0}, trusted=True, admission="mac",
                                     deadline=1_700_000_002.0, run="17r3", degraded=False))],
        "Routed": [encode(routed),
                   encode(Routed.from_admitted(
                       Admitted(request=REQUEST, accepted_at=1.0), DECISION))],
        "QueuedRows": [encode(QueuedRows(
            history=[HistoryRow("a1", "s1", "r1", "RETRIEVAL", "loops", "embedding", 0.9)],
            turns=[TurnRow("a1", "s1", "r1", "q", "answer", "RETRIEVAL")],
            logs=[RequestLogRow(request_id="r1", agent_id="a1", session_id="s1",
                                outcome="answered", confidence=0.9, stage_ms={"gen": 3.0},
                                total_ms=10.0, created_at=1_700_000_000.0)]))],
    }


# Kinds that are no JSON struct: checked on their own below.
NOT_JSON = {"ReplayRequest", "AnswerClaim", "DeadLetter"}


def schema_of(name: str) -> dict[str, Any]:
    return json.loads(render()[f"schemas/{name}.json"])


def test_committed_docs_are_what_the_contracts_generate(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["docs", "asyncapi", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    generated = {p.relative_to(tmp_path).as_posix(): p.read_bytes()
                 for p in tmp_path.rglob("*") if p.is_file()}
    committed = {p.relative_to(COMMITTED).as_posix(): p.read_bytes()
                 for p in COMMITTED.rglob("*") if p.is_file()}
    if generated != committed:
        pytest.fail(REGENERATE, pytrace=False)
    assert set(generated) == {"asyncapi.json", *(f"schemas/{m.name}.json" for m in MESSAGES)}


def test_regenerating_is_byte_identical(tmp_path: Path) -> None:
    assert render() == render()
    runner = CliRunner()
    first = runner.invoke(app, ["docs", "asyncapi", "--out", str(tmp_path)])
    before = {p: p.read_bytes() for p in tmp_path.rglob("*.json")}
    second = runner.invoke(app, ["docs", "asyncapi", "--out", str(tmp_path)])
    assert first.exit_code == second.exit_code == 0
    assert {p: p.read_bytes() for p in tmp_path.rglob("*.json")} == before


def test_check_names_what_is_stale_in_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["docs", "asyncapi", "--out", str(tmp_path)]).exit_code == 0
    assert runner.invoke(app, ["docs", "asyncapi", "--check", "--out", str(tmp_path)]
                         ).exit_code == 0
    (tmp_path / "schemas" / "Feedback.json").write_text("{}\n")
    (tmp_path / "schemas" / "Gone.json").write_text("{}\n")
    result = runner.invoke(app, ["docs", "asyncapi", "--check", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert len(result.output.strip().splitlines()) == 1
    assert "schemas/Feedback.json" in result.output
    assert "schemas/Gone.json" in result.output
    assert "run `intentroute docs asyncapi" in result.output
    # Writing again brings the folder back, the stale schema removed.
    assert runner.invoke(app, ["docs", "asyncapi", "--out", str(tmp_path)]).exit_code == 0
    assert not (tmp_path / "schemas" / "Gone.json").exists()
    assert runner.invoke(app, ["docs", "asyncapi", "--check", "--out", str(tmp_path)]
                         ).exit_code == 0


def test_a_message_of_every_kind_validates_against_its_schema() -> None:
    samples = wire_messages()
    assert set(samples) | NOT_JSON == {m.name for m in MESSAGES}
    for name, payloads in samples.items():
        validator = Draft202012Validator(schema_of(name))
        for payload in payloads:
            errors = [e.message for e in validator.iter_errors(json.loads(payload))]
            assert not errors, (name, payload, errors)
    replay = Draft202012Validator(schema_of("ReplayRequest"))
    assert replay.is_valid(b"r-42_x".decode())
    assert not replay.is_valid("two.tokens")
    assert not replay.is_valid("x" * 129)


@pytest.mark.parametrize(("name", "payload"), [
    ("AgentRequest", {"request_id": "r1", "session_id": "s1"}),  # no query
    ("AgentRequest", {"request_id": "r1", "session_id": "s1", "query": "q",
                      "timeout_ms": "soon"}),
    ("ResponseChunk", {"request_id": "r1", "seq": 0, "kind": "shout"}),
    ("ResponseChunk", {"request_id": "r1", "seq": 0, "decision": {"type": "RETRIEVAL"}}),
    ("ResponseChunk", {"request_id": "r1", "seq": 0, "error": {"code": "X"}}),
    ("Feedback", {"request_id": "r1", "outcome": "meh"}),
    ("FeedbackAck", {"request_id": "r1"}),
    ("Routed", {"request": {"request_id": "r", "session_id": "s", "query": "q"},
                "accepted_at": 1.0}),  # no decision
])
def test_a_schema_refuses_what_the_decoder_refuses(name: str, payload: dict[str, Any]) -> None:
    assert not Draft202012Validator(schema_of(name)).is_valid(payload)


def test_omitted_defaults_are_documented_with_their_values() -> None:
    chunk = document()["components"]["messages"]["ResponseChunk"]
    omitted = chunk["x-omitted-defaults"]
    assert omitted["ResponseChunk"]["kind"] == "text"
    assert omitted["ResponseChunk"]["is_final"] is False
    assert omitted["ErrorInfo"] == {"retry_after_ms": 0}
    assert "omit_defaults" in chunk["description"]
    # A text chunk on the wire is just its ids and text: the rest is the defaults.
    assert json.loads(encode(ResponseChunk(request_id="r", seq=2, text="t"))) == {
        "request_id": "r", "seq": 2, "text": "t"}
    # AgentRequest is not encoded with omit_defaults: nothing to list.
    assert "x-omitted-defaults" not in document()["components"]["messages"]["AgentRequest"]


def test_the_documents_examples_validate_against_the_schemas() -> None:
    messages = document()["components"]["messages"]
    checked = 0
    for name, message in messages.items():
        validator = Draft202012Validator(schema_of(name))
        for example in message.get("examples", []):
            assert validator.is_valid(example["payload"]), (name, example)
            checked += 1
    assert checked >= 5


def _resolve(doc: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = doc
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def test_the_document_holds_together() -> None:
    doc = document()
    assert doc["asyncapi"] == "3.0.0"
    refs = _refs(doc)
    assert refs
    for ref in refs:
        _resolve(doc, ref)  # KeyError: a dangling reference
    for key, op in doc["operations"].items():
        channel = op["channel"]["$ref"]
        for msg in op["messages"]:
            assert msg["$ref"].startswith(channel + "/messages/"), key
    for key, channel in doc["channels"].items():
        address = channel["address"]
        params = set(re.findall(r"{(\w+)}", address or ""))
        assert params == set(channel.get("parameters", {})), key
    # Every subject family of the contracts is described, the workers' marked internal.
    addresses = {c.address for c in CHANNELS}
    for subject in ("agent.request.{agentId}", "agent.response.{agentId}.{requestId}",
                    "agent.feedback.{agentId}", "agent.response.{agentId}._feedback.{requestId}",
                    "agent.replay.{agentId}", "intentroute.dlq.{durable}",
                    "intentroute.stage.classify", "intentroute.stage.generate.{slot}"):
        assert subject in addresses
    assert doc["channels"]["stageClassify"]["x-intentroute"]["internal"] is True
    assert doc["channels"]["agentRequest"]["x-intentroute"] == {
        "internal": False, "stream": "AGENT_REQUESTS", "retention": "workqueue",
        "durable": "gateway-<agent_id>"}
