"""`bench cache`: the per-agent answer cache on a real stack (issue 33).

Embedded NATS (authentication on) and Postgres, every stage worker as its own process (the
classifier with Layer 2, BM25 retrieval, the extractive answerer, the reference parser
validating code), several agents with `cache=on`. Each agent asks the documentation and
code questions of tools/bench/cache_questions.py once (their answers are stored), then, in
`rounds`, their paraphrases and hard negatives; then one document the answers used is
changed and ingested (the ingest's invalidation runs, as `intentroute ingest` runs it)
and the paraphrases are asked again.

Reported:
* `hit_rate`: paraphrases answered from the cache by an answer to the same question;
* `false_hit_rate`: hard negatives answered from the cache by another question's answer
  (a negative asked again may be given its own earlier answer: that is a right hit);
* `cross_agent_hits`: answers given from another agent's entry (no agent joined a group);
* `stale_hits_after_ingest`: after the ingest, answers given from an entry built on the
  changed document before it changed;
* `hit_p50_ms` / `hit_p99_ms`: a hit end to end (publish to final chunk), sequential;
  `miss_p50_ms` a miss's, for scale;
* `miss_overhead_ms`: p50 of the lookup a miss cost (the request log's `cache.lookup`);
* `tokens_saved`: the agents' totals (`answer_cache_totals`); with the extractive
  answerer no model counts tokens, so they are estimates (characters / 4 of the
  prompt a model would have read and of the answer).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, NamedTuple

import nats
import uvloop
from nats.aio.msg import Msg

from bench.admitted import until_admitted
from bench.cache_questions import GROUPS, Group
from intentroute.stack import embedded_stack
from intentroute.workers import STAGES, wait_for_consumers
from shared.client.caller import publish_request
from shared.common.settings import nats_servers
from shared.contracts.codec import decode_chunk
from shared.contracts.request import AgentRequest
from shared.contracts.response import ResponseChunk, agent_responses
from shared.runtime.streams import ensure_streams

REPO = Path(__file__).resolve().parents[2]


class Asked(NamedTuple):
    agent: str
    identity: str  # the question an answer to it answers ("g3", "g3/n1")
    kind: str  # base | paraphrase | negative
    final: ResponseChunk
    ms: float
    at: float
    round: int = 0


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


class Caller:
    """Asks as several agents, one request at a time, timing each to its final chunk."""

    def __init__(self) -> None:
        self.pending: dict[str, asyncio.Future[tuple[ResponseChunk, float]]] = {}
        self.connections: dict[str, Any] = {}
        self.asked: dict[str, Asked] = {}  # request id -> what it was

    async def connect(self, servers: list[str], creds: dict[str, dict[str, Any]]) -> None:
        for agent, kwargs in creds.items():
            if agent == "admin":
                continue
            nc = await nats.connect(servers, **kwargs)
            await nc.subscribe(agent_responses(agent), cb=self._on_chunk)
            self.connections[agent] = nc

    async def _on_chunk(self, msg: Msg) -> None:
        chunk = decode_chunk(msg.data)
        if chunk.is_final:
            fut = self.pending.pop(chunk.request_id, None)
            if fut is not None and not fut.done():
                fut.set_result((chunk, time.perf_counter()))

    async def ask(self, agent: str, group: Group, identity: str, kind: str,
                  query: str, round_: int = 0) -> Asked:
        req = AgentRequest(request_id=uuid.uuid4().hex, session_id=f"s-{uuid.uuid4().hex[:8]}",
                           agent_id=agent, query=query,
                           query_type="CODE_GENERATION"
                           if group.query_type == "CODE_GENERATION" else None)
        fut = self.pending[req.request_id] = asyncio.get_running_loop().create_future()
        started = time.perf_counter()
        await publish_request(self.connections[agent], req)
        chunk, ended = await asyncio.wait_for(fut, 60)
        asked = Asked(agent, identity, kind, chunk, (ended - started) * 1000, time.time(),
                      round_)
        self.asked[req.request_id] = asked
        return asked

    async def close(self) -> None:
        for nc in self.connections.values():
            await nc.drain()


def _served_from(asked: Asked, caller: Caller) -> Asked | None:
    """The ask whose answer a cache hit gave (None: not a hit, or not one of ours)."""
    if asked.final.answered_by != "cache" or asked.final.cached_from is None:
        return None
    return caller.asked.get(asked.final.cached_from.request_id)


async def _wait_stored(db_url: str, agents: list[str], quiet: float = 1.0,
                       timeout: float = 30.0) -> int:
    """Until the agents' entries stop changing for `quiet` seconds (every offer tried,
    every replica told), then their number."""
    import asyncpg

    from shared.store import asyncpg_dsn

    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        last, since, give_up = -1, time.monotonic(), time.monotonic() + timeout
        while time.monotonic() < give_up:
            count = await conn.fetchval(
                "SELECT count(*) FROM answer_cache WHERE agent_id = ANY($1)", agents)
            if count != last:
                last, since = count, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return int(count)
            await asyncio.sleep(0.1)
        return int(last)
    finally:
        await conn.close()


async def _db(db_url: str, sql: str, *args: Any) -> list[Any]:
    import asyncpg

    from shared.store import asyncpg_dsn

    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


def _changed_source(rows: list[Any], caller: Caller) -> str:
    """The document the fewest question groups' answers used (at least one)."""
    groups: dict[str, set[str]] = {}
    for row in rows:
        asked = caller.asked.get(row["request_id"])
        if asked is None:
            continue
        for source in row["sources"]:
            groups.setdefault(source, set()).add(asked.identity.split("/")[0])
    return min(groups, key=lambda s: (len(groups[s]), s))


async def _ask_all(caller: Caller, agents: list[str], rounds: int) -> list[Asked]:
    """Each agent: every paraphrase and hard negative, `rounds` times."""
    replay: list[Asked] = []
    for r in range(rounds):
        for agent in agents:
            for g, group in enumerate(GROUPS):
                for text in group.paraphrases:
                    replay.append(await caller.ask(agent, group, f"g{g}", "paraphrase", text, r))
                for n, text in enumerate(group.negatives):
                    replay.append(await caller.ask(agent, group, f"g{g}/n{n}", "negative", text,
                                                   r))
    return replay


async def _after_ingest(caller: Caller, agents: list[str], db_url: str, kb: Path,
                        index: Path) -> dict[str, Any]:
    """Change the document the fewest groups' answers used, ingest it as `intentroute
    ingest` does (its invalidation included), ask those groups again."""
    from intentroute.cli.cache_cmds import _invalidate
    from services.retriever.indexing.embedded_ingest import ingest
    from shared.encoders.fast import batch_fast_encoder

    rows = await _db(db_url, "SELECT request_id, sources FROM answer_cache "
                             "WHERE agent_id = ANY($1)", agents)
    source = _changed_source(rows, caller)
    built_on = {r["request_id"] for r in rows if source in r["sources"]}
    affected = {caller.asked[r].identity.split("/")[0] for r in built_on if r in caller.asked}
    (kb / source).write_text((kb / source).read_text(encoding="utf-8")
                             + "\n\nThis paragraph was added by the benchmark.\n",
                             encoding="utf-8")
    since = time.time()
    await asyncio.to_thread(ingest, kb, index, batch_fast_encoder("all-MiniLM-L6-v2"),
                            progress=False)
    invalidated = await _invalidate(db_url, index, elasticsearch=False, since=since)
    await _wait_stored(db_url, agents, quiet=0.5)  # every replica told of the deletions
    after: list[Asked] = []
    for agent in agents:
        for g, group in enumerate(GROUPS):
            if f"g{g}" in affected:
                for text in (group.base, *group.paraphrases):
                    after.append(await caller.ask(agent, group, f"g{g}", "paraphrase", text))
    stale = sum(1 for a in after if a.final.answered_by == "cache"
                and a.final.cached_from is not None
                and a.final.cached_from.request_id in built_on)
    return {"changed_source": source, "invalidated": invalidated,
            "asked_after_ingest": len(after), "stale_hits_after_ingest": stale,
            "after": after}


def _score(caller: Caller, replay: list[Asked], after: list[Asked]) -> dict[str, Any]:
    """A paraphrase hits when given an answer to its own question; a negative hits
    falsely when given another question's."""
    paraphrases = [a for a in replay if a.kind == "paraphrase"]
    negatives = [a for a in replay if a.kind == "negative"]
    def other_agent(asked: Asked) -> bool:
        origin = _served_from(asked, caller)
        return origin is not None and origin.agent != asked.agent

    def own_question(asked: Asked) -> bool:
        origin = _served_from(asked, caller)
        return origin is not None and origin.identity == asked.identity

    cross = sum(other_agent(a) for a in replay + after)
    hits = sum(own_question(a) for a in paraphrases)
    # The first round: each paraphrase met only the stored answer to its base question
    # (later rounds may repeat a paraphrase whose own answer was stored meanwhile).
    first = [a for a in paraphrases if a.round == 0]
    first_hits = sum(own_question(a) for a in first)
    false_hits = sum(a.final.answered_by == "cache" and not own_question(a) for a in negatives)
    hit_ms = [a.ms for a in replay if a.final.answered_by == "cache"]
    miss_ms = [a.ms for a in replay if a.final.answered_by != "cache"]
    return {
        "paraphrases_asked": len(paraphrases), "negatives_asked": len(negatives),
        "hit_rate": round(hits / len(paraphrases), 4) if paraphrases else 0.0,
        "hit_rate_first_round": round(first_hits / len(first), 4) if first else 0.0,
        "false_hit_rate": round(false_hits / len(negatives), 4) if negatives else 0.0,
        "false_hits": false_hits, "cross_agent_hits": cross,
        "hit_p50_ms": _pct(hit_ms, 0.5), "hit_p99_ms": _pct(hit_ms, 0.99),
        "miss_p50_ms": _pct(miss_ms, 0.5),
    }


async def _replay(caller: Caller, agents: list[str], rounds: int, db_url: str, kb: Path,
                  index: Path) -> dict[str, Any]:
    for agent in agents:  # the first asking: every answer is stored
        for g, group in enumerate(GROUPS):
            await caller.ask(agent, group, f"g{g}", "base", group.base)
    stored = await _wait_stored(db_url, agents)
    replay = await _ask_all(caller, agents, rounds)
    await _wait_stored(db_url, agents)
    ingested = await _after_ingest(caller, agents, db_url, kb, index)
    after = ingested.pop("after")
    return {"agents": len(agents), "rounds": rounds, "groups": len(GROUPS),
            "stored_first": stored, **_score(caller, replay, after), **ingested}


async def _figures(db_url: str, agents: list[str]) -> dict[str, Any]:
    rows = await _db(db_url, "SELECT stage_ms, answered_by, total_ms FROM request_log "
                             "WHERE agent_id = ANY($1) AND outcome = 'ok'", agents)
    lookups: list[float] = []
    hit_stage: list[float] = []
    hit_stages: dict[str, list[float]] = {}
    for row in rows:
        stages = row["stage_ms"]
        stages = json.loads(stages) if isinstance(stages, str) else stages
        if row["answered_by"] == "cache":
            for key, value in {**stages, "total_before_final": row["total_ms"]}.items():
                if value is not None:
                    hit_stages.setdefault(key, []).append(float(value))
        if "cache.lookup" in stages:
            (hit_stage if row["answered_by"] == "cache" else lookups).append(
                float(stages["cache.lookup"]))
    totals = await _db(db_url, "SELECT COALESCE(sum(tokens_saved), 0) AS saved, "
                               "COALESCE(sum(hits), 0) AS hits FROM answer_cache_totals "
                               "WHERE agent_id = ANY($1)", agents)
    return {"miss_overhead_ms": _pct(lookups, 0.5), "miss_overhead_p99_ms": _pct(lookups, 0.99),
            "hit_lookup_p50_ms": _pct(hit_stage, 0.5),
            # A hit's request log: `classify.at` from acceptance to the classifier,
            # `classify` its work until the turn's rows are written, `total_before_final`
            # from acceptance to just before the final chunk goes out.
            "hit_stage_ms_p50": {k: round(statistics.median(v), 3)
                                 for k, v in sorted(hit_stages.items())},
            "tokens_saved": int(totals[0]["saved"]), "tokens_saved_estimated": True,
            "hits_counted": int(totals[0]["hits"])}


async def _setup(state: Path, db_url: str, nats_url: str,
                 agents: list[str]) -> dict[str, dict[str, Any]]:
    import asyncpg

    from intentroute.stack.nats_users import admin_kwargs, sync_agents
    from shared.store import asyncpg_dsn
    from shared.store.agents import AgentStore
    from shared.store.policies import update_policy

    store = await AgentStore.connect(db_url)
    try:  # trusted: the code questions declare their type
        creds = {agent: await store.add(agent, trusted=True) for agent in agents}
    finally:
        await store.close()
    pool = await asyncpg.create_pool(asyncpg_dsn(db_url), min_size=1, max_size=1)
    try:
        for agent in agents:
            await update_policy(pool, agent, ["cache=on"])
    finally:
        await pool.close()
    await sync_agents(state, db_url)
    kwargs: dict[str, dict[str, Any]] = {"admin": admin_kwargs(state)}
    for agent, cred in creds.items():
        kwargs[agent] = dict(cred.nats)
        await until_admitted(nats_servers(nats_url), kwargs[agent])
    async with await nats.connect(nats_url, **kwargs["admin"]) as admin:
        await ensure_streams(admin.jetstream(), 3600, 1)
    return kwargs


async def _measure(nats_url: str, db_url: str, creds: dict[str, dict[str, Any]],
                   agents: list[str], rounds: int, kb: Path, index: Path) -> dict[str, Any]:
    servers = nats_servers(nats_url)
    admin = await nats.connect(servers, **creds["admin"])
    await wait_for_consumers(admin, list(STAGES))
    await admin.drain()
    caller = Caller()
    await caller.connect(servers, creds)
    try:
        # Warm-up (another agent: nothing it stores is ever served to the measured ones).
        for _ in range(2):
            for g, group in enumerate(GROUPS):
                await caller.ask("bench-cache-warm", group, f"w{g}", "base", group.base)
        result = await _replay(caller, agents, rounds, db_url, kb, index)
    finally:
        await caller.close()
    result.update(await _figures(db_url, agents))
    return result


def run(agents: int = 3, rounds: int = 2, batch_wait_ms: float | None = None) -> dict[str, Any]:
    """`batch_wait_ms`: the classifier's CLASSIFIER_MICRO_BATCH_WAIT_MS (None: as
    shipped, 2 ms: Layer 2 waits that long for other messages to encode with a lone
    one, most of a hit's time in the classifier)."""
    from intentroute.stack.nats_users import service_env
    from intentroute.stack.sidecars import parser_argv
    from services.retriever.indexing.embedded_ingest import ingest
    from shared.encoders.fast import batch_fast_encoder
    from shared.store import migrate

    names = [f"bench-cache-{i + 1}" for i in range(agents)]
    with tempfile.TemporaryDirectory(prefix="ir-bench-cache-") as tmp:
        state = Path(tmp)
        kb, index = state / "kb", state / "index"
        shutil.copytree(REPO / "kb" / "avap", kb)
        ingest(kb, index, batch_fast_encoder("all-MiniLM-L6-v2"), progress=False)
        with embedded_stack(state, auth=True) as (nats_url, db_url):
            migrate(db_url)
            creds = asyncio.run(_setup(state, db_url, nats_url, [*names, "bench-cache-warm"]))
            env = dict(os.environ, NATS_URL=nats_url, DATABASE_URL=db_url,
                       INTENTROUTE_HOME=str(state), INDEX_DIR=str(index),
                       RETRIEVER_METHOD="bm25", LOG_LEVEL="WARNING", HF_HUB_OFFLINE="1")
            for name in ("OLLAMA_HOST", "OPENAI_BASE_URL", "GENERATOR_BACKEND"):
                env.pop(name, None)
            if batch_wait_ms is not None:
                env["CLASSIFIER_MICRO_BATCH_WAIT_MS"] = str(batch_wait_ms)
            argv = parser_argv(env)
            procs = [subprocess.Popen(argv, env=env)] if argv else []
            procs += [
                subprocess.Popen([sys.executable, "-m", "intentroute.cli", "worker", name],
                                 env={**env, **service_env(state, name)})
                for name in STAGES
            ]
            try:
                result = uvloop.run(_measure(nats_url, db_url, creds, names, rounds, kb, index))
            finally:
                for p in procs:
                    p.terminate()
                for p in procs:
                    p.wait(15)
    result["answerer"] = "extractive"
    result["classifier_batch_wait_ms"] = 2.0 if batch_wait_ms is None else batch_wait_ms
    result["load_average"] = round(os.getloadavg()[0], 2)
    return {k: result[k] for k in (
        "hit_rate", "false_hit_rate", "cross_agent_hits", "stale_hits_after_ingest",
        "hit_p50_ms", "miss_overhead_ms", "tokens_saved")} | result


if __name__ == "__main__":
    print(json.dumps(run()))
