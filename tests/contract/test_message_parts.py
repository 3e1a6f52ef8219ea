"""Contract tier, a message carrying several requests (issue 34): the classifier splits
and routes it, each part walks its own stages on the wire (RC-04 per part: a PLATFORM
part never reaches the retriever; a CODE_GENERATION part is validated), the answer
streams part by part under a marker each, and one final chunk carries every part;
one turn, one request-log row, a classify_history entry per part."""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import NoOpTracer

from services.classifier.cascade import Cascade
from services.classifier.handlers import ClassifierDeps
from services.classifier.handlers import build_stage as classifier_stage
from services.classifier.settings import ClassifierSettings
from services.generator.handlers import GeneratorDeps
from services.generator.handlers import build_stage as generator_stage
from services.generator.settings import GeneratorSettings
from services.retriever.handlers import RetrieverDeps
from services.retriever.handlers import build_stage as retriever_stage
from services.retriever.settings import RetrieverSettings
from services.validator.handlers import ValidatorDeps
from services.validator.handlers import build_stage as validator_stage
from services.validator.settings import ValidatorSettings
from shared.client.caller import assemble
from shared.contracts.codec import decode_chunk, decode_routed, encode
from shared.contracts.ids import MAX_ID_CHARS, MAX_PART_ID_CHARS
from shared.contracts.pipeline import Admitted, Routed
from shared.contracts.request import AgentRequest
from shared.contracts.response import ChunkKind, ResponseChunk
from shared.contracts.routing import ModelSlot, QueryType
from shared.llm.fleet import Fleet
from shared.llm.walk import Walker
from shared.policy.agent import AgentPolicy, MultiIntent
from shared.store.rows import HistoryRow, RequestLogRow, TurnRow, storable
from testkit.fakes import (
    FakePolicies,
    FakeStore,
    KeywordLayer2,
    RecordingBus,
    ScriptedChecker,
    ScriptedRetrieval,
)
from testkit.wire import ADMISSION, COMMON, run_on_wire

MESSAGE = ("explain addVar, then write an endpoint that returns a total; also, can you "
           "send me my last invoice?")


# Messages the splitter cuts that the clarity gate (this cascade's) does not flag.
UNFLAGGED = ("What does addParam do? Write me an endpoint that reads a user id with it.",
             "Write an AVAP endpoint that returns the current date in ISO format. Also, how "
             "many API calls have I made this month?")


class Pipeline:
    """Every stage on one recording bus and store; `run` follows the hand-offs."""

    def __init__(self, policies: dict[str, AgentPolicy] | None = None) -> None:
        self.bus, self.store = RecordingBus(), FakeStore()
        self.retrieval = ScriptedRetrieval()
        policy = FakePolicies(policies)
        base: dict[str, Any] = {"bus": self.bus, "store": self.store, "tracer": NoOpTracer(),
                                "admission": ADMISSION}
        extractive = Walker(Fleet(), {})
        self.stages: dict[str, tuple[Any, Any]] = {
            "intentroute.stage.classify": (
                classifier_stage(ClassifierSettings(common=COMMON, heads_dir="")),
                ClassifierDeps(**base, cascade=Cascade(layer2=KeywordLayer2()),
                               policies=policy)),
            "intentroute.stage.retrieve": (
                retriever_stage(RetrieverSettings(common=COMMON)),
                RetrieverDeps(**base, retrieval=self.retrieval)),
            "intentroute.stage.generate.main": (
                generator_stage(GeneratorSettings(common=COMMON, slot=ModelSlot.MAIN)),
                GeneratorDeps(**base, walker=extractive, model="", policies=policy)),
            "intentroute.stage.generate.conversational": (
                generator_stage(GeneratorSettings(common=COMMON,
                                                  slot=ModelSlot.CONVERSATIONAL)),
                GeneratorDeps(**base, walker=extractive, model="", policies=policy)),
            "intentroute.stage.validate": (
                validator_stage(ValidatorSettings(common=COMMON)),
                ValidatorDeps(**base, checker=ScriptedChecker())),
        }
        self.visited: list[tuple[str, int]] = []

    async def run(self, query: str, **fields: Any) -> None:
        fields.setdefault("request_id", "m-1")
        env: Admitted | Routed = Admitted(
            request=AgentRequest(session_id="s", agent_id="a", query=query, **fields),
            accepted_at=0.0)
        subject, seq = "intentroute.stage.classify", 1
        for _ in range(20):
            stage, deps = self.stages[subject]
            before = len(self.bus.sent)
            await run_on_wire(stage, env, deps, stream_seq=seq)
            handed = [s for s in self.bus.sent[before:] if s.subject.startswith(
                "intentroute.stage.")]
            if not handed:
                return
            ((subject, _, _, payload),) = handed
            env = decode_routed(payload)
            self.visited.append((subject, env.part))
        raise AssertionError("no final after 20 hand-offs")


async def test_a_three_part_message_is_answered_part_by_part_in_one_stream() -> None:
    pipe = Pipeline()
    await pipe.run(MESSAGE, extra_context="invoice 2026-10: 12.40 EUR")
    chunks = pipe.bus.chunks("m-1")
    finals = [c for c in chunks if c.is_final]
    assert len(finals) == 1
    assert chunks[-1].is_final
    assert [c.seq for c in chunks] == list(range(len(chunks)))  # one ordered stream
    markers = [c for c in chunks if c.kind == ChunkKind.PART]
    assert [(m.part.index, m.part.count) for m in markers if m.part] == [(0, 3), (1, 3),
                                                                      (2, 3)]
    types = [m.part.decision.type for m in markers if m.part and m.part.decision]
    assert types == [QueryType.RETRIEVAL, QueryType.CODE_GENERATION, QueryType.PLATFORM]
    # RC-04 per part: the PLATFORM part went straight to its generator; the code part
    # through the retriever and the validator, whose one trace-guided retry (RC-08: the
    # extractive answer holds no program) regenerated that part alone.
    assert pipe.visited == [("intentroute.stage.retrieve", 0),
                            ("intentroute.stage.generate.main", 0),
                            ("intentroute.stage.retrieve", 1),
                            ("intentroute.stage.generate.main", 1),
                            ("intentroute.stage.validate", 1),
                            ("intentroute.stage.generate.main", 1),
                            ("intentroute.stage.validate", 1),
                            ("intentroute.stage.generate.conversational", 2)]
    # (The retriever may search a part twice: its relevance retry.)
    assert {q for q in pipe.retrieval.queries} == {"explain addVar",
                                                   "write an endpoint that returns a total"}
    final = finals[0]
    assert final.query_type == "RET+CODE+PLAT"
    assert [(p.index, p.query_type) for p in final.parts] == [
        (0, "RETRIEVAL"), (1, "CODE_GENERATION"), (2, "PLATFORM")]
    assert final.parts[1].validation_status == "INVALID_UNRESOLVED"
    assert final.parts[0].validation_status == final.parts[2].validation_status == ""
    # A client that knows no markers reads each part under its heading, in order.
    text = assemble(chunks)
    assert text.index("### 1. explain addVar") < text.index("### 2. ") < text.index("### 3.")
    assert "12.40" in text
    # One turn, one request-log row; a history entry per part.
    (turn,) = [r for r in pipe.store.rows if isinstance(r, TurnRow)]
    assert turn.query == MESSAGE
    assert turn.query_type == "RET+CODE+PLAT"
    (row,) = [r for r in pipe.store.rows if isinstance(r, RequestLogRow)]
    assert (row.request_id, row.outcome, row.query_type) == ("m-1", "ok", "RET+CODE+PLAT")
    history = [r for r in pipe.store.rows if isinstance(r, HistoryRow)]
    assert [h.type for h in history] == ["RETRIEVAL", "CODE_GENERATION", "PLATFORM"]
    assert [h.request_id for h in history] == ["m-1#1", "m-1#2", "m-1#3"]


async def test_the_parts_of_a_message_with_the_longest_request_id_keep_their_own_ids() -> None:
    """A part's id is its message's request id and its place: with a 128-character
    request id it is longer than a request id may be (classify_history and feedback hold
    it since migration 0020), never cut into another part's."""
    longest = "r" * MAX_ID_CHARS
    pipe = Pipeline()
    await pipe.run(MESSAGE, extra_context="invoice 2026-10: 12.40 EUR", request_id=longest)
    history = [r for r in pipe.store.rows if isinstance(r, HistoryRow)]
    assert [h.request_id for h in history] == [f"{longest}#{k}" for k in (1, 2, 3)]
    assert all(len(storable(h).request_id) <= MAX_PART_ID_CHARS for h in history)
    assert [storable(h) for h in history] == history


async def test_a_single_request_with_steps_is_not_split() -> None:
    pipe = Pipeline()
    await pipe.run("write an endpoint that reads a param, hashes it and returns it")
    chunks = pipe.bus.chunks("m-1")
    assert not [c for c in chunks if c.kind == ChunkKind.PART]
    (final,) = [c for c in chunks if c.is_final]
    assert final.query_type == "CODE_GENERATION"
    assert not final.parts


async def test_the_agents_policy_may_answer_the_first_request_only_or_ask() -> None:
    first = Pipeline({"a": AgentPolicy(multi_intent=MultiIntent.FIRST)})
    await first.run(MESSAGE, extra_context="invoice 2026-10: 12.40 EUR")
    (final,) = [c for c in first.bus.chunks("m-1") if c.is_final]
    assert (final.query_type, final.parts) == ("RETRIEVAL", [])
    assert "invoice" not in assemble(first.bus.chunks("m-1")).lower()
    ask = Pipeline({"a": AgentPolicy(multi_intent=MultiIntent.ASK)})
    await ask.run(MESSAGE)
    (final,) = [c for c in ask.bus.chunks("m-1") if c.is_final]
    # Asked when the clarity gate sees several requests; else answered as one: never cut.
    assert final.kind in (ChunkKind.CLARIFICATION, ChunkKind.FINAL)
    assert not final.parts
    assert not [c for c in ask.bus.chunks("m-1") if c.kind == ChunkKind.PART]
    for message in UNFLAGGED:
        ask = Pipeline({"a": AgentPolicy(multi_intent=MultiIntent.ASK)})
        await ask.run(message)
        (final,) = [c for c in ask.bus.chunks("m-1") if c.is_final]
        assert (final.kind, final.parts) == (ChunkKind.FINAL, []), message


async def test_a_redelivered_part_opens_once_and_its_reset_keeps_the_earlier_parts() -> None:
    """A part's first stage delivered again (its worker died after sending the marker)
    does not send the marker twice; a reset of the part's text drops that part's text
    only, never the parts before it."""
    pipe = Pipeline()
    await pipe.run(MESSAGE, extra_context="invoice 2026-10: 12.40 EUR")
    (part2,) = [s for s in pipe.bus.sent if s.subject == "intentroute.stage.generate."
                "conversational"]
    env = decode_routed(part2.payload)
    stage, deps = pipe.stages["intentroute.stage.generate.conversational"]
    pipe2 = Pipeline()
    # The earlier parts' chunks, as stored, then the part's first delivery cut off after
    # its marker: the redelivery finds the marker and sends it once.
    for sent in pipe.bus.sent:
        if sent.subject == "agent.response.a.m-1":
            chunk = decode_chunk(sent.payload)
            if chunk.kind == ChunkKind.PART and chunk.part and chunk.part.index == 2:
                pipe2.bus.sent.append(sent)
                break
            pipe2.bus.sent.append(sent)
    stage, deps = pipe2.stages["intentroute.stage.generate.conversational"]
    await run_on_wire(stage, env, deps, deliveries=2)
    chunks = pipe2.bus.chunks("m-1")
    assert [c.part.index for c in chunks if c.kind == ChunkKind.PART and c.part] == [0, 1, 2]
    assert sum(c.is_final for c in chunks) == 1
    text = assemble([*chunks[:-1], ResponseChunk(request_id="m-1", seq=99,
                                                 kind=ChunkKind.RESET), chunks[-1]])
    assert "### 1. explain addVar" in text  # the earlier parts survive a reset
    assert "### 2." in text


def _stream_until(pipe: Pipeline, stop: Any) -> Pipeline:
    """A fresh pipeline whose bus holds what `pipe`'s answer subject stored up to and
    including the first chunk `stop(chunk)` accepts, and every claim `pipe` stored: the
    state a redelivery finds after its worker died at that point."""
    later = Pipeline()
    later.bus.claims = dict(pipe.bus.claims)
    for sent in pipe.bus.sent:
        if sent.subject == "agent.response.a.m-1":
            later.bus.sent.append(sent)
            if stop(decode_chunk(sent.payload)):
                break
    return later


def _opens(chunk: ResponseChunk, index: int) -> bool:
    return chunk.kind == ChunkKind.PART and chunk.part is not None and chunk.part.index == index


async def test_a_part_redelivered_mid_answer_to_the_stage_that_opened_it_opens_it_once() -> None:
    """The PLATFORM part's generator opens the part and streams it; killed after a piece
    of its text, its redelivery sends no second marker, and its reset drops that part's
    text only."""
    pipe = Pipeline()
    await pipe.run(MESSAGE, extra_context="invoice 2026-10: 12.40 EUR")
    (part2,) = [s for s in pipe.bus.sent
                if s.subject == "intentroute.stage.generate.conversational"]
    later = _stream_until(pipe, lambda chunk: _opens(chunk, 2))
    marker = later.bus.chunks("m-1")[-1]
    # The piece of text the first delivery streamed before it died.
    await later.bus.publish("agent.response.a.m-1", encode(ResponseChunk(
        request_id="m-1", seq=marker.seq + 1, text="half an answ")))
    stage, deps = later.stages["intentroute.stage.generate.conversational"]
    await run_on_wire(stage, decode_routed(part2.payload), deps, deliveries=2)
    chunks = later.bus.chunks("m-1")
    assert [c.part.index for c in chunks if c.kind == ChunkKind.PART and c.part] == [0, 1, 2]
    assert [c.kind for c in chunks[-3:]] == [ChunkKind.TEXT, ChunkKind.RESET, ChunkKind.FINAL]
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert sum(c.is_final for c in chunks) == 1
    assert assemble(chunks) == assemble(pipe.bus.chunks("m-1"))


async def test_a_part_redelivered_after_the_next_part_began_leaves_the_stream_alone() -> None:
    """The stage that ended part 1 (its generator) handed part 2 on and died before its
    message was acknowledged; part 2's retriever opened it and its generator streams.
    The redelivery of part 1's message sends nothing on the answer (no reset, no second
    copy of part 1 inside part 2) and hands part 2 on again under the same msg id (a
    no-op for the stream's duplicate window)."""
    pipe = Pipeline()
    await pipe.run(MESSAGE, extra_context="invoice 2026-10: 12.40 EUR")
    ends_part0 = next(s for s in pipe.bus.sent if s.subject == "intentroute.stage.generate.main"
                      and decode_routed(s.payload).part == 0)
    seen: list[ResponseChunk] = []

    def inside_part1(chunk: ResponseChunk) -> bool:
        seen.append(chunk)
        return len(seen) >= 2 and _opens(seen[-2], 1)

    later = _stream_until(pipe, inside_part1)
    before = len(later.bus.sent)
    stage, deps = later.stages["intentroute.stage.generate.main"]
    await run_on_wire(stage, decode_routed(ends_part0.payload), deps, deliveries=2)
    again = later.bus.sent[before:]
    assert not [s for s in again if s.subject.startswith("agent.response.")]
    handed = [s for s in pipe.bus.sent if s.subject == "intentroute.stage.retrieve"
              and decode_routed(s.payload).part == 1]
    assert [(s.subject, s.msg_id) for s in again] == [(h.subject, h.msg_id) for h in handed]
