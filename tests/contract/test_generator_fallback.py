"""Contract tier, generator: the agent's fallback chain decides what a failing backend's
request gets, and the request log counts what each answer took (ADR-0006)."""

from __future__ import annotations

import time

import msgspec

from services.generator.handlers import build_stage
from services.generator.ports import TokenCounts
from services.generator.settings import GeneratorSettings
from shared.client.caller import assemble
from shared.contracts.codec import decode_routed
from shared.contracts.pipeline import Passage, Routed, Usage
from shared.contracts.routing import ModelSlot, QueryType
from shared.policy.agent import AgentPolicy
from shared.store.rows import RequestLogRow
from testkit.fakes import FakeStore, RecordingBus
from testkit.wire import COMMON, request, routed_decision, run_on_wire
from tests.contract.test_generator_contract import Scripted, deps_for

MAIN = GeneratorSettings(common=COMMON, slot=ModelSlot.MAIN)


def retrieval(rid: str, agent: str = "a") -> Routed:
    return Routed(request=request(rid, "how do loops work", agent_id=agent),
                  accepted_at=time.time(),
                  decision=routed_decision(QueryType.RETRIEVAL),
                  passages=[Passage("d", "Loops", "Use startLoop(i, 1, 5).", 1.0)])


def log_row(store: FakeStore) -> RequestLogRow:
    (row,) = [r for r in store.rows if isinstance(r, RequestLogRow)]
    return row


async def run(env: Routed, backend: Scripted | None, *,
              policies: dict[str, AgentPolicy] | None = None,
              settings: GeneratorSettings = MAIN) -> tuple[RecordingBus, FakeStore]:
    bus, store = RecordingBus(), FakeStore()
    await run_on_wire(build_stage(settings), env, deps_for(bus, store, backend, policies))
    return bus, store


def chain(value: str) -> AgentPolicy:
    return AgentPolicy(fallback={"main": value.split(",")})


async def test_a_model_answer_is_counted_as_the_backend_reported_it() -> None:
    backend = Scripted("Loops ", "use ", "startLoop.", counts=TokenCounts(321, 7), delay=0.1)
    bus, store = await run(retrieval("t-1"), backend)
    row = log_row(store)
    assert (row.model, row.tokens_in, row.tokens_out, row.tokens_note) == ("fake/m", 321, 7, "")
    assert (row.fallback, row.fallback_reason) == (False, "")
    assert row.answered_by == "fake/m"
    assert row.compute_ms is not None
    assert row.compute_ms >= 300
    # Streamed in pieces: the first piece went out (with the second token, the stream
    # holding one piece back) well before the answer was complete.
    assert row.total_ms is not None
    assert row.first_chunk_ms is not None
    assert 200 <= row.first_chunk_ms <= row.total_ms - 80
    assert bus.chunks("t-1")[-1].answered_by == "fake/m"


async def test_counts_the_backend_does_not_report_are_zero_with_a_note() -> None:
    _, store = await run(retrieval("t-2"), Scripted("an answer"))
    row = log_row(store)
    assert (row.tokens_in, row.tokens_out, row.tokens_note) == (0, 0, "not reported by fake")


async def test_without_an_agent_chain_a_failing_model_falls_back_to_the_extractive_answer(
) -> None:
    backend = Scripted("half ", "an ", "answer", fail_after=True)
    bus, store = await run(retrieval("f-1"), backend)
    chunks = bus.chunks("f-1")
    assert chunks[-1].error is None
    assert chunks[-1].answered_by == "extractive"
    assert "reset" in [c.kind for c in chunks]
    row = log_row(store)
    assert (row.model, row.tokens_in, row.tokens_out, row.tokens_note) == (
        "extractive", 0, 0, "extractive")
    assert (row.fallback, row.fallback_reason) == (True, "cut fake/m")
    assert backend.models == ["m"]


async def test_the_agents_chain_decides_what_a_failing_backends_request_gets() -> None:
    """The same outage: the IDE agent's chain ends in the extractive answer, the chat
    agent's in an explicit error, and an agent without a chain gets today's default."""
    policies = {"ide": chain("extractive"), "chat": chain("error")}
    answers = {}
    for agent in ("ide", "chat", "other"):
        backend = Scripted("never", failing=("m",))
        bus, store = await run(retrieval(f"o-{agent}", agent), backend, policies=policies)
        (final,) = [c for c in bus.chunks(f"o-{agent}", agent) if c.is_final]
        answers[agent] = (final, log_row(store), backend.models)

    ide, ide_row, ide_models = answers["ide"]
    assert ide.error is None
    assert ide.answered_by == "extractive"
    assert "startLoop" in ide.text
    assert (ide_row.outcome, ide_row.fallback, ide_row.model) == ("ok", True, "extractive")

    chat, chat_row, chat_models = answers["chat"]
    assert chat.error is not None
    assert chat.error.code == "BACKEND_UNAVAILABLE"
    assert "refused fake/m" in chat.error.message
    assert chat_row.outcome == "error:BACKEND_UNAVAILABLE"
    assert (chat_row.fallback, chat_row.fallback_reason, chat_row.model) == (
        True, "refused fake/m", "")
    assert ide_models == chat_models == ["m"]

    other, _, _ = answers["other"]
    assert other.answered_by == "extractive"


async def test_the_chain_tries_its_models_in_order_and_records_why_it_fell_back() -> None:
    backend = Scripted("small ", "answer", failing=("m", "m2"))
    policies = {"a": chain("m2,m3,error")}
    bus, store = await run(retrieval("c-1"), backend, policies=policies)
    assert backend.models == ["m", "m2", "m3"]
    assert assemble(bus.chunks("c-1")) == "small answer"
    row = log_row(store)
    assert (row.model, row.answered_by, row.fallback) == ("fake/m3", "fake/m3", True)
    assert row.fallback_reason == "refused fake/m +1"


async def test_the_slot_model_is_not_tried_twice_when_the_chain_names_it() -> None:
    backend = Scripted("x", failing=("m",))
    await run(retrieval("c-2"), backend, policies={"a": chain("m,m2,extractive")})
    assert backend.models == ["m", "m2"]


async def test_a_chain_for_another_slot_does_not_apply() -> None:
    policies = {"a": AgentPolicy(fallback={"conversational": ["error"]})}
    bus, _ = await run(retrieval("c-3"), Scripted("x", failing=("m",)), policies=policies)
    assert bus.chunks("c-3")[-1].answered_by == "extractive"


async def test_without_a_model_server_the_extractive_answer_is_no_fallback() -> None:
    bus, store = await run(retrieval("n-1"), None, policies={"a": chain("error")})
    assert bus.chunks("n-1")[-1].answered_by == "extractive"
    row = log_row(store)
    assert (row.model, row.fallback, row.tokens_note) == ("extractive", False, "extractive")
    # An answer in one piece goes out with the final chunk, right after this row.
    assert row.first_chunk_ms is not None
    assert row.total_ms is not None
    assert abs(row.total_ms - row.first_chunk_ms) < 50


async def test_code_carries_its_accounting_to_the_validator() -> None:
    env = Routed(request=request("g-1", "write a loop"), accepted_at=0.0,
                 decision=routed_decision(QueryType.CODE_GENERATION))
    backend = Scripted("```avap\n", "addResult(1)\n```", counts=TokenCounts(50, 9))
    bus, store = await run(env, backend)
    out = decode_routed(bus.sent[0][3])
    assert out.usage is not None
    assert (out.usage.model, out.usage.tokens_in, out.usage.tokens_out) == ("fake/m", 50, 9)
    assert store.rows == []
    # The RC-08 retry adds its own counts to the first attempt's.
    retry = msgspec.structs.replace(out, attempt=1, admission="")
    bus, _ = await run(retry, backend)
    again = decode_routed(bus.sent[0][3]).usage
    assert again is not None
    assert (again.tokens_in, again.tokens_out) == (100, 18)
    assert again.compute_ms >= out.usage.compute_ms


async def test_code_whose_chain_ends_in_an_error_is_answered_with_it() -> None:
    env = Routed(request=request("g-2", "write a loop"), accepted_at=0.0,
                 decision=routed_decision(QueryType.CODE_GENERATION))
    bus, store = await run(env, Scripted("x", failing=("m",)), policies={"a": chain("error")})
    (final,) = bus.chunks("g-2")
    assert final.is_final
    assert final.error is not None
    assert final.error.code == "BACKEND_UNAVAILABLE"
    assert log_row(store).fallback


async def test_with_accounting_off_the_log_has_no_accounting() -> None:
    settings = GeneratorSettings(common=msgspec.structs.replace(COMMON, accounting=False))
    backend = Scripted("half", fail_after=True, counts=TokenCounts(1, 1))
    bus, store = await run(retrieval("off-1"), backend, settings=settings)
    row = log_row(store)
    assert (row.model, row.tokens_in, row.tokens_out, row.tokens_note, row.first_chunk_ms,
            row.compute_ms, row.fallback, row.fallback_reason) == (
        "", 0, 0, "", None, None, False, "")
    assert row.answered_by == "extractive"  # the answer itself is the same
    assert bus.chunks("off-1")[-1].error is None


def test_usage_is_a_defaulted_field_old_envelopes_decode_without_it() -> None:
    env = retrieval("u-1")
    assert env.usage is None
    decoded = decode_routed(msgspec.json.encode(env))
    assert decoded.usage is None
    assert Usage().model == ""
