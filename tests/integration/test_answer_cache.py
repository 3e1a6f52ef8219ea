"""The per-agent answer cache end to end (issue 33), every worker on real NATS JetStream
and PostgreSQL with the extractive answerer: a paraphrase is answered from the cache
like any answer, near-duplicates and other agents' entries never are, what may not be
stored never is, and a changed document takes the answers built on it away."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from shared.client.caller import assemble
from shared.contracts.response import ChunkKind, ResponseChunk
from shared.store import asyncpg_dsn
from tests.helpers.agents import Connections, add_agents
from tests.helpers.cache import cache_writers, classifier_cache, stage_deps
from tests.helpers.pipeline import ask_all, base_env, make_request, running

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# Agents of their own: a policy set here never changes another test's answers.
AGENTS = {"cache-a": False, "cache-b": False, "cache-c": False, "cache-t": True}


@pytest.fixture(scope="module")
async def cache_agents(stack: tuple[str, str]) -> dict[str, Any]:
    return await add_agents(*stack, AGENTS)


@pytest.fixture
async def connect(nats_url: str, cache_agents: dict[str, Any]) -> AsyncIterator[Any]:
    connections = Connections(nats_url, cache_agents)
    yield connections
    await connections.close()


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    yield conn
    await conn.close()


async def set_policy(db: asyncpg.Connection, agent: str, **policy: Any) -> None:
    import json

    await db.execute(
        "INSERT INTO agent_policies (agent_id, settings) VALUES ($1, $2::jsonb) "
        "ON CONFLICT (agent_id) DO UPDATE SET settings = EXCLUDED.settings",
        agent, json.dumps(policy))
    await db.execute("DELETE FROM answer_cache WHERE agent_id = $1", agent)


async def stored(apps: list[Any], request_id: str) -> int:
    """The entry stored for a request, once the classifier's index holds it (the stage
    offers the answer after its final chunk went out)."""
    found: list[int] = []

    def holds(index: Any) -> bool:
        found[:] = [e.id for e in index.entries() if e.request_id == request_id]
        return bool(found)

    await classifier_cache(apps).settled(holds)
    return found[0]


async def none_stored(apps: list[Any], nc: Any, db: asyncpg.Connection, agent: str,
                      request_ids: list[str]) -> None:
    """None of these requests' answers is stored: a request asked after them, whose
    answer is, is stored after whatever they offered was tried."""
    sentinel = make_request(f"What does getListLen return? {time.time_ns()}", agent_id=agent)
    await ask_all(nc, sentinel)
    await stored(apps, sentinel.request_id)
    for writer in cache_writers(apps):
        await writer.flush()
    assert await db.fetch("SELECT request_id FROM answer_cache WHERE request_id = ANY($1)",
                          request_ids) == []


def final(chunks: list[ResponseChunk]) -> ResponseChunk:
    assert sum(c.is_final for c in chunks) == 1
    assert chunks[-1].is_final
    assert [c.seq for c in chunks] == sorted(c.seq for c in chunks)
    return chunks[-1]


async def test_a_paraphrase_is_answered_from_the_cache_like_an_answer(
        connect, db, nats_url, database_url, kb_index) -> None:
    await set_policy(db, "cache-a", cache=True)
    nc = await connect("cache-a")
    env = base_env(nats_url, database_url, kb_index)
    async with running(env) as apps:
        first = make_request("What does addVar do?", agent_id="cache-a", session_id="s-cache")
        original = await ask_all(nc, first)
        assert final(original).answered_by == "extractive"
        entry = await stored(apps, first.request_id)

        again = make_request("How does addVar work?", agent_id="cache-a", session_id="s-cache")
        started = time.time()
        chunks = await ask_all(nc, again)
        hit = final(chunks)
        assert hit.answered_by == "cache"
        assert hit.error is None
        assert hit.kind == ChunkKind.FINAL
        assert hit.query_type == "RETRIEVAL"
        assert hit.cached_from is not None
        assert hit.cached_from.request_id == first.request_id
        assert 0 <= hit.cached_from.age_s <= time.time() - started + 60
        assert assemble(chunks) == assemble(original)
        # A near-duplicate is not: another command, a negation.
        for near in ("What does addParam do?", "What does addVar not do?"):
            miss = final(await ask_all(nc, make_request(near, agent_id="cache-a")))
            assert miss.answered_by == "extractive", near

        # The next CONVERSATIONAL turn refers to the cached answer.
        follow = await ask_all(nc, make_request("say it again", agent_id="cache-a",
                                                session_id="s-cache",
                                                query_type="CONVERSATIONAL"))
        assert assemble(original).split("]\n", 1)[-1][:40] in assemble(follow)

    log = await db.fetchrow(
        "SELECT answered_by, model, tokens_in, tokens_out, tokens_note, outcome, stage_ms "
        "FROM request_log WHERE agent_id = 'cache-a' AND request_id = $1", again.request_id)
    assert log["answered_by"] == "cache"
    assert log["model"] == "cache"
    assert (log["tokens_in"], log["tokens_out"]) == (0, 0)
    assert log["tokens_note"].startswith("cache: ")
    assert log["outcome"] == "ok"
    turn = await db.fetchval(
        "SELECT content FROM messages WHERE agent_id = 'cache-a' AND request_id = $1 "
        "AND role = 'assistant'", again.request_id)
    assert turn == assemble(original)
    counted = await db.fetchrow("SELECT hits, last_hit_at FROM answer_cache WHERE id = $1",
                                entry)
    assert counted["hits"] >= 1


async def reload_policies(apps: list[Any]) -> None:
    """Every worker reads the policies now (instead of at its next refresh)."""
    for deps in stage_deps(apps):
        policies = getattr(deps, "policies", None)
        if policies is not None:
            assert await policies.reload()


async def test_agents_never_see_each_others_entries_unless_both_joined_one_group(
        connect, db, nats_url, database_url, kb_index) -> None:
    for agent in ("cache-a", "cache-b", "cache-c"):
        await set_policy(db, agent, cache=True)
    a, b, c = await connect("cache-a"), await connect("cache-b"), await connect("cache-c")
    env = base_env(nats_url, database_url, kb_index)
    async with running(env) as apps:
        question = make_request("What does itemFromList do?", agent_id="cache-a")
        await ask_all(a, question)
        entry = await stored(apps, question.request_id)
        # Another agent asking the same question gets an answer of its own.
        other = make_request("What does itemFromList do?", agent_id="cache-b")
        assert final(await ask_all(b, other)).answered_by == "extractive"
        await stored(apps, other.request_id)
        # A group only cache-a joined shares nothing.
        await set_policy_keep(db, "cache-a", cache=True, cache_group="docs")
        await reload_policies(apps)
        asked_alone = make_request("How does itemFromList work?", agent_id="cache-c")
        alone = final(await ask_all(c, asked_alone))
        assert alone.answered_by == "extractive"
        await stored(apps, asked_alone.request_id)  # its own answer, dropped next
        # Both in the group (cache-c's own entries dropped): cache-a's answer is shared.
        await set_policy(db, "cache-c", cache=True, cache_group="docs")
        await reload_policies(apps)
        await classifier_cache(apps).settled(lambda index: not index.holds("cache-c"))
        shared = final(await ask_all(c, make_request("How does itemFromList work?",
                                                     agent_id="cache-c")))
        assert shared.answered_by == "cache"
        assert shared.cached_from is not None
        assert shared.cached_from.request_id == question.request_id
        # cache-b, in no group, still only ever gets its own entries.
        again = final(await ask_all(b, make_request("How does itemFromList work?",
                                                    agent_id="cache-b")))
        assert again.answered_by == "cache"
        assert again.cached_from is not None
        assert again.cached_from.request_id == other.request_id
    owners = {r["agent_id"] for r in await db.fetch(
        "SELECT agent_id FROM answer_cache WHERE id = $1", entry)}
    assert owners == {"cache-a"}


async def set_policy_keep(db: asyncpg.Connection, agent: str, **policy: Any) -> None:
    """The agent's policy, its entries kept."""
    import json

    await db.execute("UPDATE agent_policies SET settings = $2::jsonb WHERE agent_id = $1",
                     agent, json.dumps(policy))


async def test_a_poisoned_entry_cannot_be_planted_for_another_agent(
        connect, db, nats_url, database_url, kb_index) -> None:
    """An agent can only ever fill its own entries: whatever it asks first, another
    agent asking the same gets an answer of its own; and an envelope that did not come
    through the gateway is never answered, let alone stored."""
    await set_policy(db, "cache-a", cache=True)
    await set_policy(db, "cache-b", cache=True)
    a, b = await connect("cache-a"), await connect("cache-b")
    env = base_env(nats_url, database_url, kb_index)
    async with running(env) as apps:
        planted = make_request("What does getTimeStamp return?", agent_id="cache-b")
        await ask_all(b, planted)
        await stored(apps, planted.request_id)
        victim = make_request("What does getTimeStamp return?", agent_id="cache-a")
        assert final(await ask_all(a, victim)).answered_by == "extractive"
    rows = await db.fetch("SELECT agent_id, request_id FROM answer_cache "
                          "WHERE request_id = ANY($1)", [planted.request_id, victim.request_id])
    assert {(r["agent_id"], r["request_id"]) for r in rows} <= {
        ("cache-b", planted.request_id), ("cache-a", victim.request_id)}


async def test_platform_conversational_context_and_fallen_back_answers_are_never_stored(
        connect, db, nats_url, database_url, kb_index, fake_ollama) -> None:
    await set_policy(db, "cache-t", cache=True)
    nc = await connect("cache-t")
    env = base_env(nats_url, database_url, kb_index, OLLAMA_HOST=fake_ollama.url,
                   OLLAMA_MODEL_NAME="big:1.7b", CLASSIFIER_LLM_MODEL="")
    never = [
        make_request("You have a project usage percentage of 20%, give one tip",
                     agent_id="cache-t", extra_context="usage_percentage=20"),
        make_request("What does addVar do? usage is 3%", agent_id="cache-t",
                     extra_context="plan=starter"),
        make_request("say it again in fewer words", agent_id="cache-t",
                     query_type="CONVERSATIONAL"),
        make_request("What does addVar do here?", agent_id="cache-t",
                     editor_context="addVar(total, 0)\naddResult(total)"),
        make_request("What does addVar do?", agent_id="cache-t", query_type="PLATFORM"),
        # No parser: the code is PARSER_UNAVAILABLE, not VALID.
        make_request("Write an endpoint that returns the user id", agent_id="cache-t",
                     query_type="CODE_GENERATION"),
    ]
    async with running(env) as apps:
        kept = make_request("What does addResult do?", agent_id="cache-t")
        assert final(await ask_all(nc, kept)).answered_by == "ollama/big:1.7b"
        await stored(apps, kept.request_id)
        for req in never:
            assert final(await ask_all(nc, req)).error is None
        fake_ollama.missing.add("big:1.7b")  # the model is gone: the chain falls back
        fell_back = make_request("What does getRegex return?", agent_id="cache-t")
        assert final(await ask_all(nc, fell_back)).answered_by == "extractive"
        fake_ollama.missing.clear()
        await none_stored(apps, nc, db, "cache-t",
                          [r.request_id for r in [*never, fell_back]])


async def test_an_answer_serves_only_requests_whose_first_model_answered_it(
        connect, db, nats_url, database_url, kb_index, fake_ollama) -> None:
    """The model half of the key is the request's first model (`chosen_model`): the one
    it names when its agent's policy lists it (`models=`), else the slot's. An answer
    the named model gave serves a paraphrase naming it, never one the slot's model
    answers, and the reverse."""
    await set_policy(db, "cache-t", cache=True, models=["ollama/small:1"])
    nc = await connect("cache-t")
    env = base_env(nats_url, database_url, kb_index, OLLAMA_HOST=fake_ollama.url,
                   OLLAMA_MODEL_NAME="big:1.7b", OLLAMA_MODEL_NAME_CONVERSATIONAL="small:1",
                   CLASSIFIER_LLM_MODEL="")
    async with running(env) as apps:
        named = make_request("What does addResult do?", agent_id="cache-t",
                             model="ollama/small:1")
        assert final(await ask_all(nc, named)).answered_by == "ollama/small:1"
        entry = await stored(apps, named.request_id)
        assert await db.fetchval("SELECT model FROM answer_cache WHERE id = $1",
                                 entry) == "ollama/small:1"
        plain = make_request("How does addResult work?", agent_id="cache-t")
        assert final(await ask_all(nc, plain)).answered_by == "ollama/big:1.7b"
        await stored(apps, plain.request_id)
        hit = final(await ask_all(nc, make_request("How does addResult work?",
                                                   agent_id="cache-t",
                                                   model="ollama/small:1")))
        assert hit.answered_by == "cache"
        assert hit.cached_from is not None
        assert hit.cached_from.request_id == named.request_id
        slot = final(await ask_all(nc, make_request("What does addResult do?",
                                                    agent_id="cache-t")))
        assert slot.answered_by == "cache"
        assert slot.cached_from is not None
        assert slot.cached_from.request_id == plain.request_id


async def test_a_changed_document_invalidates_the_answers_built_on_it_and_nothing_else(
        connect, db, nats_url, database_url, tmp_path) -> None:
    from intentroute.cli.cache_cmds import _invalidate
    from services.retriever.indexing.embedded_ingest import ingest
    from shared.encoders.fast import batch_fast_encoder

    kb, index = tmp_path / "kb", tmp_path / "index"
    kb.mkdir()
    for name in ("variables.md", "crypto.md", "datetime.md"):
        shutil.copy(REPO / "kb" / "avap" / name, kb / name)
    encoder = batch_fast_encoder("all-MiniLM-L6-v2")
    ingest(kb, index, encoder, progress=False)
    await set_policy(db, "cache-a", cache=True)
    nc = await connect("cache-a")
    env = base_env(nats_url, database_url, index, RETRIEVER_TOP_K="2")
    async with running(env) as apps:
        asked = {}
        for query in ("What does addVar do?", "What does encodeSHA256 do?"):
            req = make_request(query, agent_id="cache-a")
            await ask_all(nc, req)
            asked[query] = await stored(apps, req.request_id)
        sources = {q: set(await db.fetchval("SELECT sources FROM answer_cache WHERE id = $1",
                                            e)) for q, e in asked.items()}
        # The question whose answer used a document the other one's did not.
        (q_stale, q_kept) = sorted(asked, key=lambda q: -len(sources[q] - sources[
            next(o for o in asked if o != q)]))
        changed = sorted(sources[q_stale] - sources[q_kept])
        assert changed, sources
        (kb / changed[0]).write_text((kb / changed[0]).read_text() + "\n\nA new paragraph.\n")
        since = time.time()
        assert (await asyncio.to_thread(ingest, kb, index, encoder, progress=False)).changed
        assert await _invalidate(database_url, index, elasticsearch=False, since=since) >= 1
        cache = classifier_cache(apps)
        await cache.settled(lambda ix: asked[q_stale] not in ix)
        assert asked[q_kept] in cache.index
        paraphrase = {"What does addVar do?": "How does addVar work?",
                      "What does encodeSHA256 do?": "How does encodeSHA256 work?"}
        stale = final(await ask_all(nc, make_request(paraphrase[q_stale],
                                                     agent_id="cache-a")))
        assert stale.answered_by == "extractive"
        fresh = final(await ask_all(nc, make_request(paraphrase[q_kept], agent_id="cache-a")))
        assert fresh.answered_by == "cache"


async def test_a_validated_code_answer_is_served_again(
        connect, db, nats_url, database_url, kb_index, parser) -> None:
    address, _ = parser
    await set_policy(db, "cache-t", cache=True)
    nc = await connect("cache-t")
    env = base_env(nats_url, database_url, kb_index, AVAP_PARSER_URL=address)
    async with running(env) as apps:
        first = make_request("Write an endpoint that returns the user id",
                             agent_id="cache-t", query_type="CODE_GENERATION")
        original = final(await ask_all(nc, first))
        assert original.validation_status == ""  # VALID
        await stored(apps, first.request_id)
        chunks = await ask_all(nc, make_request("Create an endpoint that returns the user id",
                                                agent_id="cache-t",
                                                query_type="CODE_GENERATION"))
        hit = final(chunks)
        assert hit.answered_by == "cache"
        assert hit.validation_status == ""
        assert hit.avap_code == original.avap_code
        assert hit.cached_from is not None
        assert hit.cached_from.request_id == first.request_id
        other = final(await ask_all(nc, make_request(
            "Write an endpoint that returns the order id", agent_id="cache-t",
            query_type="CODE_GENERATION")))
        assert other.answered_by != "cache"


async def test_a_negative_verdict_on_a_cached_answer_evicts_its_entry(
        connect, db, nats_url, database_url, kb_index) -> None:
    from shared.client.caller import send_feedback
    from shared.contracts.feedback import Feedback, FeedbackOutcome

    await set_policy(db, "cache-b", cache=True)
    nc = await connect("cache-b")
    env = base_env(nats_url, database_url, kb_index)
    async with running(env) as apps:
        first = make_request("What does getDateTime return?", agent_id="cache-b")
        await ask_all(nc, first)
        entry = await stored(apps, first.request_id)
        served = make_request("What does getDateTime return", agent_id="cache-b")
        assert final(await ask_all(nc, served)).answered_by == "cache"
        ack = await send_feedback(nc, "cache-b", Feedback(
            request_id=served.request_id, outcome=FeedbackOutcome.USER_REJECTED))
        assert ack.accepted
        await classifier_cache(apps).settled(lambda index: entry not in index)
        again = final(await ask_all(nc, make_request("what does getDateTime return?",
                                                     agent_id="cache-b")))
        assert again.answered_by == "extractive"
    totals = await db.fetchrow("SELECT evicted_feedback, hits FROM answer_cache_totals "
                               "WHERE agent_id = 'cache-b'")
    assert totals["evicted_feedback"] >= 1


def test_cache_stats_and_clear_commands(database_url: str) -> None:
    import json

    from typer.testing import CliRunner

    from intentroute.cli import app

    runner = CliRunner()
    env = {"DATABASE_URL": database_url}
    shown = runner.invoke(app, ["cache", "stats", "--agent", "cache-b", "--json"], env=env)
    assert shown.exit_code == 0, shown.output
    stats = json.loads(shown.stdout.strip().splitlines()[-1])
    assert set(stats) == {"agents", "total"}
    cleared = runner.invoke(app, ["cache", "clear", "--agent", "cache-b", "--json"], env=env)
    assert cleared.exit_code == 0, cleared.output
    assert json.loads(cleared.stdout.strip().splitlines()[-1])["agent"] == "cache-b"
    after = json.loads(runner.invoke(app, ["cache", "stats", "--agent", "cache-b", "--json"],
                                     env=env).stdout.strip().splitlines()[-1])
    assert after["agents"].get("cache-b", {}).get("entries", 0) == 0
