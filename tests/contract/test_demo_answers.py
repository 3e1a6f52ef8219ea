"""Contract tier, the demo's questions without a model: a greeting gets a greeting, and
"explain this" with a file in the editor is answered from that file. Each request goes
through the real stages on wire bytes (classifier with its rules, retriever, generator,
validator with the reference parser in process), as under `intentroute up`."""

from __future__ import annotations

from pathlib import Path

import pytest
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
from services.retriever.indexing.chunking import chunk_markdown
from services.retriever.settings import RetrieverSettings
from services.validator.handlers import ValidatorDeps
from services.validator.handlers import build_stage as validator_stage
from services.validator.parser_client import GuardedParser
from services.validator.settings import ValidatorSettings
from shared.client.caller import assemble
from shared.contracts.pipeline import Admitted, Passage
from shared.contracts.response import ResponseChunk, ValidationStatus
from shared.contracts.routing import ModelSlot
from shared.llm.fleet import Fleet
from shared.llm.walk import Walker
from testkit.fakes import FakePolicies, FakeStore, InProcessParser, RecordingBus, ScriptedRetrieval
from testkit.wire import ADMISSION, COMMON, request, run_on_wire

REPO = Path(__file__).resolve().parents[2]
HANDLER = (REPO / "examples" / "handler.avap").read_text(encoding="utf-8")
PREVIOUS = "[extractive answer: ...]\nUse startLoop(i, 1, 10) and close it with endLoop()."


def kb_passages(name: str) -> list[Passage]:
    """The demo knowledge base's sections of one page, as the index holds them."""
    text = (REPO / "kb" / "avap" / name).read_text(encoding="utf-8")
    return [Passage(c.doc_id, c.title, c.text, 1.0, c.source)
            for c in chunk_markdown(text, name)]


# A passage the question's words find but the editor does not use: the answer once
# quoted a passage like it instead of the editor (issue 21).
UNRELATED = Passage("loops#0", "Loops: startLoop and endLoop > startLoop",
                    "startLoop(i, 1, 10) repeats the block below it ten times.", 2.0, "loops.md")


async def ask(query: str, *, editor: str = "", passages: list[Passage] | None = None,
              previous: str = PREVIOUS) -> tuple[list[ResponseChunk], list[str]]:
    """One request through the stages it is routed to; its chunks and the stages run."""
    bus = RecordingBus()
    store = FakeStore(previous=previous)
    base = {"bus": bus, "store": store, "tracer": NoOpTracer(), "admission": ADMISSION}
    stages = {
        "intentroute.stage.retrieve": (
            retriever_stage(RetrieverSettings(common=COMMON, relevance_mode="off")),
            RetrieverDeps(**base, retrieval=ScriptedRetrieval(passages or []))),
        "intentroute.stage.validate": (
            validator_stage(ValidatorSettings(common=COMMON)),
            ValidatorDeps(**base, checker=GuardedParser(InProcessParser()))),
        **{f"intentroute.stage.generate.{slot.value}": (
            generator_stage(GeneratorSettings(common=COMMON, slot=slot)),
            GeneratorDeps(**base, walker=Walker(Fleet(), {}), model="",
                          policies=FakePolicies()))
           for slot in ModelSlot},
    }
    admitted = Admitted(request=request("d-1", query, editor_context=editor), accepted_at=0.0)
    await run_on_wire(classifier_stage(ClassifierSettings(common=COMMON, heads_dir="")),
                      admitted, ClassifierDeps(**base, cascade=Cascade(),
                                               policies=FakePolicies()))
    ran = ["classify"]
    done = 0
    while done < len(bus.sent):
        subject, payload = bus.sent[done].subject, bus.sent[done].payload
        done += 1
        if subject in stages:
            stage, deps = stages[subject]
            ran.append(subject.removeprefix("intentroute.stage."))
            await run_on_wire(stage, payload, deps)
    return bus.chunks("d-1"), ran


@pytest.mark.parametrize(("query", "reply"), [
    ("hello!", "Hello! Ask me about AVAP"),
    ("good morning", "Hello! Ask me about AVAP"),
    ("Hi there, how are you?", "Hello! Ask me about AVAP"),
    ("thanks!", "You're welcome!"),
    ("hola", "¡Hola! Pregúntame sobre AVAP"),
    ("buenos días", "¡Hola! Pregúntame sobre AVAP"),
    ("¡muchas gracias!", "¡De nada!"),
    ("hasta luego", "¡Hasta luego!"),
])
async def test_a_greeting_gets_a_canned_greeting_in_its_language(query: str, reply: str) -> None:
    for previous in (PREVIOUS, ""):
        chunks, ran = await ask(query, previous=previous)
        assert ran == ["classify", "generate.conversational"]
        assert sum(c.is_final for c in chunks) == 1
        assert chunks[-1].query_type == "CONVERSATIONAL"
        text = assemble(chunks)
        assert reply in text
        assert "previous answer" not in text
        assert "startLoop" not in text


async def test_a_reshape_request_still_reshapes_the_previous_answer() -> None:
    chunks, _ = await ask("en menos palabras")
    assert "startLoop(i, 1, 10)" in assemble(chunks)


async def test_explain_this_answers_from_the_editor_with_the_commands_documentation() -> None:
    docs = kb_passages("crypto.md") + kb_passages("database.md")
    chunks, ran = await ask("explain this", editor=HANDLER, passages=[UNRELATED, *docs])

    assert ran == ["classify", "retrieve", "generate.main", "validate"]
    final = chunks[-1]
    assert sum(c.is_final for c in chunks) == 1
    assert final.is_final
    assert final.query_type == "CODE_GENERATION"
    # The parser checked the editor's program, which is the code the answer carries.
    assert final.validation_status == ValidationStatus.VALID
    assert final.avap_code == HANDLER.strip("\n")
    text = assemble(chunks)
    assert "startLoop" not in text  # the unrelated passage is not the answer
    assert "built from your editor" in text
    # Each command of the editor, with the indexed docs' one line where a passage has it.
    for command in ("addParam", "encodeSHA256", "addVar", "try", "ormDirect", "exception",
                    "end", "getListLen", "if", "else", "addResult"):
        assert f"`{command}`" in text
    assert ("`encodeSHA256` (line 4: `encodeSHA256(plainPassword, passwordHash)`): "
            "Computes the SHA-256 digest of a string and stores it as a hexadecimal "
            "string.") in text
    assert "POST /login" in text  # the program's own comment


async def test_explain_this_shows_the_parser_trace_of_a_broken_editor_program() -> None:
    broken = "addParam(password, plain)\ngetSHA256(plain, digest)\naddResult(digest)\n"
    chunks, ran = await ask("¿qué hace esto?", editor=broken)

    # The validator's one retry (RC-08) regenerates with the trace; the extractive
    # answer then says what the parser found, and the code stays the editor's.
    assert ran == ["classify", "retrieve", "generate.main", "validate", "generate.main",
                   "validate"]
    final = chunks[-1]
    assert final.validation_status == ValidationStatus.INVALID_UNRESOLVED
    assert final.avap_code == broken.strip("\n")
    text = assemble(chunks)
    assert "The AVAP parser rejects it" in text
    assert "line 2: `getSHA256(plain, digest)`" in text
    assert "did you mean 'encodeSHA256'?" in text  # the parser's trace
