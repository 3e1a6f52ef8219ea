"""Every way a model server fails, end to end on real NATS and Postgres through a
generator worker, against the fault-injecting provider (testkit.fault_provider): the
agent's chain is walked across a two-backend fleet (LLM_FLEET), and whatever the first
step does, the caller gets exactly one final chunk and never a truncated answer
presented as complete.

The slot's model is the chain's first step (the fault, on backend `bad`); each agent's
chain (its policy) says what follows: a model that continues a cut answer (`good`,
prefill = true), one that restarts it (`plain`, prefill = false), a model that refuses a
prefill, `@if_unavailable` and `@within` steps, a step with too small a context. Each
fault runs its own generator (the slot's model is the fault) behind one gateway and
classifier for the module. Backends are named per run: their circuits live in the
shared KV bucket, which other tests' backends must not share.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client

from shared.client.caller import ask
from shared.contracts.response import ChunkKind, ResponseChunk
from shared.policy.agent import AgentPolicy
from shared.store import asyncpg_dsn
from shared.store.policies import save_policy
from testkit.fault_provider import ANSWER, FaultProvider, is_complete
from tests.helpers.agents import Connections, add_agents
from tests.helpers.pipeline import base_env, make_request, running

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex[:6]
BAD, GOOD, PLAIN, SMALL, FLAKY = (f"{name}-{RUN}" for name in
                                  ("bad", "good", "plain", "small", "flaky"))
# The agents' latency targets (their policy) and the global first-byte time.
TTFT_MS, STALL_MS, FIRST_BYTE_MS = 800, 500, 600
# The provider's slow first token: past the agents' ttft.
SLOW_TTFT_S = 1.6
GENERATOR = "generator-conversational"

# Agent -> its conversational chain after the slot's model (the fault).
CHAINS = {
    "ff-cont": [f"{GOOD}/ok", "extractive"],
    "ff-restart": [f"{PLAIN}/ok", "extractive"],
    "ff-prefill": [f"{BAD}/prefill-reject", "extractive"],
    "ff-ifu": [f"{GOOD}/ok@if_unavailable", "extractive"],
    "ff-within": [f"{GOOD}/ok@within=5s", "extractive"],
    "ff-late": [f"{GOOD}/ok@within=400ms", "extractive"],
    "ff-ctx": [f"{SMALL}/ok", f"{GOOD}/ok", "extractive"],
    "ff-error": ["error"],
}


def fleet_toml(base_url: str) -> str:
    """`bad` serves every fault (each declared to continue a prefill, so a refused
    prefill is the server's doing), `good` continues a cut answer, `plain` restarts it,
    `small` has a context no larger than the one `context-length` refuses."""
    from testkit.fault_provider import EXTRA, FAULTS

    def backend(name: str, models: dict[str, str]) -> str:
        lines = [f"[backends.{name}]", 'kind = "openai"', f'url = "{base_url}"']
        lines += [f'[backends.{name}.models."{m}"]\n{spec}' for m, spec in models.items()]
        return "\n".join(lines)

    bad = {m: "prefill = true\ncontext = 4096" for m in (*FAULTS, *EXTRA)}
    return "\n\n".join([
        backend(BAD, bad),
        backend(GOOD, {"ok": "prefill = true\ncontext = 128000"}),
        backend(PLAIN, {"ok": "prefill = false\ncontext = 128000"}),
        backend(SMALL, {"ok": "prefill = true\ncontext = 2048"}),
        backend(FLAKY, {"flap": "prefill = true"}),
        f'[slots]\nmain = "{GOOD}/ok"\nconversational = "{GOOD}/ok"',
    ]) + "\n"


@dataclass
class Asked:
    """One request as its caller saw it: every chunk with its arrival time."""

    agent: str
    request_id: str
    session_id: str
    chunks: list[ResponseChunk]
    arrived: list[float]
    calls: int  # the provider's requests for the slot's fault during it

    @property
    def final(self) -> ResponseChunk:
        return self.chunks[-1]

    @property
    def resets(self) -> int:
        return sum(c.kind == ChunkKind.RESET for c in self.chunks)

    def seen(self) -> str:
        """Every piece of text the caller was sent, run together."""
        return "".join(c.text for c in self.chunks
                       if c.kind == ChunkKind.TEXT or (c.is_final and c.error is None))

    def delivered(self) -> str:
        """The answer as a caller that honours the reset marker has it."""
        text = ""
        for c in self.chunks:
            if c.kind == ChunkKind.RESET:
                text = ""
            elif c.kind == ChunkKind.TEXT or (c.is_final and c.error is None):
                text += c.text
        return text

    def widest_gap(self) -> float:
        """The longest wait between two text chunks (seconds)."""
        times = [t for c, t in zip(self.chunks, self.arrived, strict=True)
                 if c.kind == ChunkKind.TEXT or c.is_final]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


class Faults:
    """The module's stack: the provider, the fleet file, the agents, the gateway and the
    classifier; `generator(fault)` runs the generator whose slot's model is the fault."""

    def __init__(self, provider: FaultProvider, env: dict[str, str],
                 connect: Connections, db: asyncpg.Connection) -> None:
        self.provider = provider
        self.env = env
        self.connect = connect
        self.connected: dict[str, Client] = {}
        self.db = db

    def generator_env(self, slot_model: str, **extra: str) -> dict[str, str]:
        return {**self.env, "MODEL_CONVERSATIONAL": slot_model, **extra}

    @contextlib.asynccontextmanager
    async def generator(self, fault: str, **extra: str) -> AsyncIterator[None]:
        async with running(self.generator_env(f"{BAD}/{fault}", **extra), (GENERATOR,)):
            yield

    async def ask(self, agent: str, fault: str) -> Asked:
        """One request of `agent`; `fault` is the model whose calls are counted."""
        if agent not in self.connected:
            self.connected[agent] = await self.connect(agent)
        req = make_request("say that again", agent_id=agent, query_type="CONVERSATIONAL")
        since = time.monotonic()
        chunks, arrived = [], []
        async for chunk in ask(self.connected[agent], req, timeout=30):
            chunks.append(chunk)
            arrived.append(time.monotonic())
        return Asked(agent, req.request_id, req.session_id, chunks, arrived,
                     self.provider.count(fault, since=since))

    async def row(self, asked: Asked) -> dict[str, Any]:
        """The request's log row (an error's is written just after its final)."""
        deadline = time.monotonic() + 10
        while True:
            row = await self.db.fetchrow(
                "SELECT outcome, model, answered_by, fallback, fallback_reason, tokens_in, "
                "tokens_out, tokens_note, model_parts FROM request_log WHERE agent_id = $1 "
                "AND request_id = $2", asked.agent, asked.request_id)
            if row is not None or time.monotonic() > deadline:
                assert row is not None, "no request-log row"
                parts = row["model_parts"]  # JSONB: text as asyncpg reads it
                return {**row, "model_parts": json.loads(parts) if parts else None}
            await asyncio.sleep(0.05)

    async def stored_answer(self, asked: Asked) -> str | None:
        answer: str | None = await self.db.fetchval(
            "SELECT content FROM messages WHERE agent_id = $1 AND session_id = $2 "
            "AND role = 'assistant' ORDER BY id DESC LIMIT 1", asked.agent, asked.session_id)
        return answer


@pytest.fixture(scope="module")
async def faults(nats_url: str, database_url: str, kb_index: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Faults]:
    creds = await add_agents(nats_url, database_url, dict.fromkeys(CHAINS, True))
    db = await asyncpg.connect(asyncpg_dsn(database_url))
    for agent, chain in CHAINS.items():
        await save_policy(db, agent, AgentPolicy(fallback={"conversational": chain},
                                                 ttft_ms=TTFT_MS, stall_ms=STALL_MS))
    fleet = tmp_path_factory.mktemp("fleet") / "fleet.toml"
    connect = Connections(nats_url, creds)
    async with FaultProvider(slow_ttft_s=SLOW_TTFT_S) as provider:
        fleet.write_text(fleet_toml(provider.base_url), encoding="utf-8")
        env = base_env(nats_url, database_url, kb_index, CLASSIFIER_HEADS_DIR="",
                       GENERATOR_BACKEND="openai", LLM_FLEET=str(fleet),
                       LLM_FIRST_BYTE_MS=str(FIRST_BYTE_MS),
                       # The faults' own tests: no circuit opens (its test has its own).
                       LLM_CIRCUIT_FAILURES="1000")
        try:
            async with running(env, ("gateway", "classifier")):
                yield Faults(provider, env, connect, db)
        finally:
            await connect.close()
            await db.execute("DELETE FROM agent_policies WHERE agent_id = ANY($1::text[])",
                             list(CHAINS))
            await db.close()


def assert_one_final_never_truncated(asked: Asked) -> None:
    """One final chunk, last; an answer without an error is a complete answer as the
    caller has it (the reset marker honoured) — the provider's whole answer, or the
    extractive answerer's own."""
    finals = [c for c in asked.chunks if c.is_final]
    assert len(finals) == 1, asked.chunks
    assert asked.final.is_final
    if asked.final.error is None and asked.final.answered_by != "extractive":
        assert is_complete(asked.delivered()), (asked.final.answered_by, asked.delivered())


# fault -> (who answers, the fault model's calls per request, the fallback reason)
# "next": the chain's next model (continuing or restarting, by the agent).
OUTCOMES = {
    "ok": ("self", 1, ""),
    "cut-40": ("next", 1, "cut"),
    "stall": ("next", 1, "stalled"),
    "reset": ("next", 2, "reset"),  # one retry on the same model
    "silent": ("next", 1, "no_response"),  # not asked again by the request
    "slow-ttft": ("next", 1, "slow"),
    "429-retry": ("self", 2, "rate_limited"),  # Retry-After: 1 waited for
    "429": ("next", 3, "overloaded"),  # bounded attempts, jittered backoff
    "503": ("next", 3, "overloaded"),
    "500-once": ("self", 2, "server_error"),  # one retry on the same model
    "500": ("next", 2, "server_error"),
    "malformed": ("self", 1, ""),  # the malformed chunk skipped
    "no-done": ("self", 1, ""),  # finalised with what came
    "context-length": ("next", 1, "context_length"),  # not retried on that model
    "prefill-reject": ("self", 1, ""),  # no prefill to refuse as the first step
}


@pytest.mark.parametrize("fault", list(OUTCOMES))
async def test_each_fault_ends_in_one_final_and_a_complete_answer(
    faults: Faults, fault: str,
) -> None:
    who, calls, reason = OUTCOMES[fault]
    async with faults.generator(fault):
        asked = {agent: await faults.ask(agent, fault) for agent in ("ff-cont", "ff-restart")}
    for agent, fallback in (("ff-cont", GOOD), ("ff-restart", PLAIN)):
        got = asked[agent]
        assert_one_final_never_truncated(got)
        assert got.final.error is None
        expected = f"{BAD}/{fault}" if who == "self" else f"{fallback}/ok"
        assert got.final.answered_by == expected, (agent, got.final)
        assert is_complete(got.delivered())
        assert got.calls == calls, (agent, got.calls)
        row = await faults.row(got)
        assert (row["outcome"], row["model"], row["answered_by"]) == ("ok", expected, expected)
        assert row["fallback"] is (who == "next")
        assert row["fallback_reason"].startswith(f"{reason} {BAD}/{fault}" if reason else "")
        # What the system keeps as the answer is what the caller has.
        assert await faults.stored_answer(got) == got.delivered()
        if fault in ("cut-40", "stall") and agent == "ff-cont":
            # Continued from what was sent: no reset, and the text the caller was sent,
            # run together, is the answer (the cut part is not sent twice).
            assert got.resets == 0
            assert got.seen() == ANSWER
            sent = 40 if fault == "cut-40" else 20
            assert row["model_parts"] == [[f"{BAD}/{fault}", 0, sent],
                                          [f"{GOOD}/ok", row["model_parts"][1][1], 60 - sent]]
            assert (row["tokens_out"], row["tokens_note"]) == (
                60, f"a cut part counted by its pieces ({BAD})")
        elif fault in ("cut-40", "stall"):
            # Restarted: one reset marker before the replacement, which alone is billed.
            assert got.resets == 1
            assert row["model_parts"] is None
            assert row["tokens_out"] == 60
        else:
            assert got.resets == 0
            assert got.seen() == ANSWER
            assert row["model_parts"] is None
    if fault == "stall":
        # Handed over within the agent's stall_ms (+ 1 s): the widest gap in the stream.
        for agent in ("ff-cont", "ff-restart"):
            assert asked[agent].widest_gap() <= STALL_MS / 1000 + 1.0


async def test_a_cut_answer_whose_fallback_refuses_the_prefill_is_restarted(
    faults: Faults,
) -> None:
    """The next model is declared to continue a prefill, but its server refuses one:
    the step restarts the answer on that model (reset marker, then a whole answer);
    the refusal does not hide the cut, and no part is delivered twice."""
    async with faults.generator("cut-40"):
        got = await faults.ask("ff-prefill", "prefill-reject")
    assert_one_final_never_truncated(got)
    assert got.final.answered_by == f"{BAD}/prefill-reject"
    assert got.resets == 1
    assert is_complete(got.delivered())
    assert got.calls == 2  # refused with the prefill, then answered without it
    refused, answered = faults.provider.calls[-2:]
    assert (refused.prefill_words, refused.outcome) == (40, "400")
    assert (answered.prefill_words, answered.outcome) == (-1, "200")
    row = await faults.row(got)
    assert row["fallback_reason"].startswith(f"cut {BAD}/cut-40")
    assert row["model_parts"] is None


@pytest.mark.parametrize("fault", [
    "content-filter", "content-filter-mid"])
async def test_a_content_filter_is_a_typed_error_and_no_other_model_is_asked(
    faults: Faults, fault: str,
) -> None:
    since = time.monotonic()
    async with faults.generator(fault):
        got = await faults.ask("ff-cont", fault)
    assert_one_final_never_truncated(got)
    assert got.final.error is not None
    assert got.final.error.code == "CONTENT_FILTERED"
    assert "content" in got.final.error.message
    assert got.calls == 1
    assert faults.provider.count("ok", since=since) == 0
    row = await faults.row(got)
    assert row["outcome"] == "error:CONTENT_FILTERED"
    assert_partial_text_reset_before_the_error(got)


def assert_partial_text_reset_before_the_error(got: Asked) -> None:
    """Words that went out before the answer failed are dropped by a reset marker just
    before the error (the caller never keeps a part of an answer as if it stood)."""
    if got.seen():
        assert got.chunks[-2].kind == ChunkKind.RESET, got.chunks[-3:]


@pytest.mark.parametrize("fault", [
    "silent", "cut-40"])
async def test_a_chain_ending_in_error_answers_a_typed_error(
    faults: Faults, fault: str,
) -> None:
    async with faults.generator(fault):
        got = await faults.ask("ff-error", fault)
    assert_one_final_never_truncated(got)
    assert got.final.error is not None
    assert got.final.error.code == "BACKEND_UNAVAILABLE"
    assert f"{BAD}/{fault}" in got.final.error.message
    row = await faults.row(got)
    assert (row["outcome"], row["model"]) == ("error:BACKEND_UNAVAILABLE", "")
    assert_partial_text_reset_before_the_error(got)


async def test_a_prompt_too_long_moves_on_only_to_a_larger_context(faults: Faults) -> None:
    since = time.monotonic()
    async with faults.generator("context-length"):
        got = await faults.ask("ff-ctx", "context-length")
    assert_one_final_never_truncated(got)
    assert got.final.answered_by == f"{GOOD}/ok"
    assert got.calls == 1
    # `small` (a 2048-token context, no larger than the 4096 that refused) is passed over.
    assert [c.model for c in faults.provider.calls if c.at >= since] == ["context-length", "ok"]


async def test_if_unavailable_is_not_used_when_the_first_step_is_merely_slow(
    faults: Faults,
) -> None:
    since = time.monotonic()
    async with faults.generator("slow-ttft"):
        slow = await faults.ask("ff-ifu", "slow-ttft")
    assert_one_final_never_truncated(slow)
    assert slow.final.answered_by == "extractive"
    assert faults.provider.count("ok", since=since) == 0
    async with faults.generator("503"):
        down = await faults.ask("ff-ifu", "503")
    assert_one_final_never_truncated(down)
    assert down.final.answered_by == f"{GOOD}/ok"
    assert is_complete(down.delivered())


async def test_within_is_used_while_the_latency_target_allows(faults: Faults) -> None:
    async with faults.generator("slow-ttft"):
        early = await faults.ask("ff-within", "slow-ttft")
        late = await faults.ask("ff-late", "slow-ttft")
    assert_one_final_never_truncated(early)
    assert early.final.answered_by == f"{GOOD}/ok"
    assert is_complete(early.delivered())
    # The slow first step took the agent's ttft (800 ms): past `within=400ms`.
    assert_one_final_never_truncated(late)
    assert late.final.answered_by == "extractive"


async def test_flap_down_falls_back_and_up_answers_again(faults: Faults) -> None:
    faults.provider.go_down(60)
    try:
        async with faults.generator("flap"):
            down = await faults.ask("ff-cont", "flap")
            faults.provider.go_up()
            up = await faults.ask("ff-cont", "flap")
    finally:
        faults.provider.go_up()
    assert_one_final_never_truncated(down)
    assert down.final.answered_by == f"{GOOD}/ok"
    assert_one_final_never_truncated(up)
    assert up.final.answered_by == f"{BAD}/flap"


async def test_the_circuit_is_shared_by_replicas_and_probed_back(faults: Faults) -> None:
    """Two failures open the flaky backend's circuit on one replica; a second replica,
    started after, skips it without calling it; once the server is back, one probe
    after the cooldown closes it and the primary answers again."""
    extra = {"LLM_CIRCUIT_FAILURES": "2", "LLM_CIRCUIT_COOLDOWN": "2"}
    env = faults.generator_env(f"{FLAKY}/flap", **extra)
    faults.provider.go_down(120)
    try:
        async with contextlib.AsyncExitStack() as first:
            await first.enter_async_context(running(env, (GENERATOR,)))
            for _ in range(2):
                got = await faults.ask("ff-cont", "flap")
                assert got.final.answered_by == f"{GOOD}/ok"
                assert got.calls == 3  # overloaded: three attempts each
            async with running(env, (GENERATOR,)):
                await first.aclose()  # only the second replica is left
                for _ in range(3):
                    skipped = await faults.ask("ff-cont", "flap")
                    assert_one_final_never_truncated(skipped)
                    assert skipped.final.answered_by == f"{GOOD}/ok"
                    assert skipped.calls == 0  # the open circuit: not called
                row = await faults.row(skipped)
                assert row["fallback_reason"].startswith(f"circuit_open {FLAKY}/flap")
                faults.provider.go_up()
                recovered = time.monotonic()
                while True:
                    back = await faults.ask("ff-cont", "flap")
                    assert_one_final_never_truncated(back)
                    if back.final.answered_by == f"{FLAKY}/flap":
                        break
                    assert time.monotonic() - recovered < 10, "never back on the primary"
                    await asyncio.sleep(0.2)
                assert faults.provider.count("flap", since=recovered) == 1  # one probe
    finally:
        faults.provider.go_up()
