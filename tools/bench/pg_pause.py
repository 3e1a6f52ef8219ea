"""Postgres paused: SIGSTOP of the postgres server (every process of it) for 20 s under
steady load; what the answers felt.

Two loads. Returning sessions (the default, issue 32): 4 agents ask over 50 sessions
that already have turns when the pause starts (1,000 requests in 60 s: 20 s before, 20
s paused, 20 s after), each session's turns cycling through a RETRIEVAL question, a
CONVERSATIONAL rephrase (it reads the previous answer) and a deictic follow-up (the
classifier reads the intent history); the generator of both slots answers. New sessions
(`sessions=0`): RETRIEVAL questions, each on a session of its own (nothing to read), 10/s,
3 s before the pause and 5 s after it.

Scenario `postgres_pause_20s` of `intentroute bench chaos --json` (bench/chaos.py), on
a stack of its own (auth on, one replica of each worker the questions go through, the
echo generator). Keys: sent, answered_once (exactly one final seen live), lost (no final
within the deadline), duplicate_finals, error_finals, gap_s (the longest time without
any final delivered, from the pause's start to the end of the load), stall_s (the
longest any question asked during the pause waited for its final, less the median
before it), latency_s (p50 before, p50 / max during the pause), history_unavailable
(finals whose decision says the session could not be read), rows_missing (answered
requests without their request-log row, classify_history row or two messages once the
row writer is done, 30 s at most).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (a postgres server: the postmaster and its backends)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            # The command may hold spaces and parentheses: the ppid follows the last ")".
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


@contextlib.contextmanager
def paused(pid: int) -> Iterator[list[int]]:
    """SIGSTOP `pid` and its descendants (a server paused as a whole: its connections
    stay open and answer nothing), SIGCONT them on exit."""
    tree = process_tree(pid)
    for member in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGSTOP)
    try:
        yield tree
    finally:
        for member in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(member, signal.SIGCONT)


AGENT = "pause"
WORKERS = ("gateway", "classifier", "retriever", "generator-main")
# Returning sessions: the conversational slot answers the rephrases and the follow-ups.
SESSION_WORKERS = (*WORKERS, "generator-conversational")
AGENTS = 4
# A returning session's turns, in turn: one that needs no database, one that reads the
# previous answer (a rephrase: CONVERSATIONAL), one that reads the intent history (a
# deictic follow-up). (query, declared type: the agents are trusted)
TURNS = (("What does addParam do?", "RETRIEVAL"), ("say that in fewer words", None),
         ("and how do I use it?", None))


def _requests(sessions: int) -> Iterator[Any]:
    """The load's requests: on new sessions (`sessions` 0), or cycling over `sessions`
    returning ones of AGENTS agents, each session's turns through TURNS."""
    from shared.contracts.request import AgentRequest

    if not sessions:
        while True:
            yield AgentRequest(request_id=uuid.uuid4().hex, session_id=uuid.uuid4().hex[:12],
                               agent_id=AGENT, query="What does addParam do?",
                               query_type="RETRIEVAL")
    names = [f"sess-{uuid.uuid4().hex[:8]}-{i}" for i in range(sessions)]
    turn = 0
    while True:
        for i, session in enumerate(names):
            query, declared = TURNS[turn % len(TURNS)]
            yield AgentRequest(request_id=uuid.uuid4().hex, session_id=session,
                               agent_id=f"{AGENT}-{i % AGENTS}", query=query,
                               query_type=declared)
        turn += 1


def longest_gap(finals: list[float], start: float, end: float) -> float:
    """The longest time in [start, end] without a final delivered."""
    marks = [start, *sorted(t for t in finals if start < t < end), end]
    return max(b - a for a, b in itertools.pairwise(marks))


async def _load(state: Path, index: Path, pause: float, rate: float,
                before: float, after: float, sessions: int) -> dict[str, Any]:
    import nats

    from intentroute.stack import NatsServer, PostgresServer
    from intentroute.stack.nats_users import admin_kwargs, auth_files, service_env, sync_agents
    from intentroute.supervisor import Supervisor
    from intentroute.workers import wait_for_consumers
    from shared.client.caller import publish_until_stored
    from shared.contracts.codec import decode_chunk
    from shared.contracts.response import agent_responses
    from shared.runtime.streams import ensure_streams
    from shared.store import migrate
    from shared.store.agents import AgentStore

    agent_ids = [f"{AGENT}-{i}" for i in range(AGENTS)] if sessions else [AGENT]
    workers = SESSION_WORKERS if sessions else WORKERS
    natsd = NatsServer(state / "nats", creds_dir=auth_files(state).creds_dir)
    pg = PostgresServer(state / "postgres")
    natsd.start()
    pg.start()
    supervisor = Supervisor()
    conns: list[Any] = []
    try:
        await asyncio.to_thread(migrate, pg.url)
        agents = await AgentStore.connect(pg.url)
        try:
            creds = {name: await agents.add(name, trusted=True) for name in agent_ids}
        finally:
            await agents.close()
        await sync_agents(state, pg.url)
        admin = await nats.connect(natsd.url, **admin_kwargs(state))
        await ensure_streams(admin.jetstream(), 3600)
        env = dict(os.environ, NATS_URL=natsd.url, DATABASE_URL=pg.url,
                   INTENTROUTE_HOME=str(state), INDEX_DIR=str(index), RETRIEVER_METHOD="bm25",
                   CLASSIFIER_HEADS_DIR="", GENERATOR_BACKEND="echo", LOG_LEVEL="ERROR")
        for name in workers:
            supervisor.add(name, [sys.executable, "-m", "intentroute.cli", "worker", name],
                           {**env, **service_env(state, name)})
        await wait_for_consumers(admin, list(workers))
        await admin.close()
        finals: dict[str, list[float]] = {}
        errors: Counter[str] = Counter()
        unread: set[str] = set()

        async def on_chunk(msg: Any) -> None:
            chunk = decode_chunk(msg.data)
            if chunk.is_final:
                finals.setdefault(chunk.request_id, []).append(time.monotonic())
                if chunk.error:
                    errors[chunk.error.code] += 1
                if getattr(chunk.decision, "history_unavailable", False):
                    unread.add(chunk.request_id)

        for name in agent_ids:
            nc = await nats.connect(natsd.url, **creds[name].nats)
            conns.append(nc)
            await nc.subscribe(agent_responses(name), cb=on_chunk)
        by_agent = dict(zip(agent_ids, conns, strict=True))
        sent: dict[str, float] = {}
        tasks = set()
        start = time.monotonic()
        pause_at, resume_at = start + before, start + before + pause
        stopped = contextlib.ExitStack()
        was_paused = False
        load = _requests(sessions)
        while (now := time.monotonic()) < resume_at + after:
            if pause_at <= now < resume_at and not was_paused:
                assert pg.proc is not None
                stopped.enter_context(paused(pg.proc.pid))
                was_paused = True
            elif now >= resume_at:
                stopped.close()
            req = next(load)
            sent[req.request_id] = time.monotonic()
            tasks.add(asyncio.create_task(publish_until_stored(
                by_agent[req.agent_id], req, give_up_at=time.monotonic() + 60)))
            await asyncio.sleep(1 / rate)
        end = time.monotonic()
        stopped.close()
        await asyncio.gather(*tasks, return_exceptions=True)
        for _ in range(240):  # every question answered, or 60 s
            if all(rid in finals for rid in sent):
                break
            await asyncio.sleep(0.25)
        await asyncio.sleep(1.0)  # a second final, if any, would arrive now
        for nc in conns:
            await nc.drain()
        conns.clear()
        missing = await _rows_missing(pg.url, agent_ids, set(finals))
    finally:
        for nc in conns:
            await nc.close()
        supervisor.stop(timeout=15)
        natsd.stop()
        pg.stop()
    return _report(sent, finals, errors, pause_at, resume_at, end) | {
        "pause_s": pause, "sessions": sessions, "agents": len(agent_ids),
        "history_unavailable": len(unread), "rows_missing": missing}


async def _rows_missing(url: str, agent_ids: list[str], answered: set[str]) -> int:
    """Answered requests without their request-log row, classify_history row or two
    messages once the row writer is done (30 s at most)."""
    import asyncpg

    from shared.store import asyncpg_dsn

    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        for _ in range(120):
            counts: Counter[str] = Counter()
            for table, per in (("request_log", 1), ("classify_history", 1), ("messages", 2)):
                for r in await conn.fetch(
                        f"SELECT request_id, count(*) AS n FROM {table} "
                        "WHERE agent_id = ANY($1::text[]) GROUP BY request_id", agent_ids):
                    counts[r["request_id"]] += r["n"] >= per
            missing = sum(1 for rid in answered if counts[rid] < 3)
            if not missing:
                break
            await asyncio.sleep(0.25)
    finally:
        await conn.close()
    return missing


def _report(sent: dict[str, float], finals: dict[str, list[float]], errors: Counter[str],
            pause_at: float, resume_at: float, end: float) -> dict[str, Any]:
    waits = {rid: finals[rid][0] - at for rid, at in sent.items() if rid in finals}
    calm = [w for rid, w in waits.items() if sent[rid] < pause_at]
    during = [w for rid, w in waits.items() if pause_at <= sent[rid] < resume_at]
    base = statistics.median(calm) if calm else 0.0
    return {
        "sent": len(sent),
        "answered_once": sum(1 for rid in sent if len(finals.get(rid, [])) == 1),
        "lost": sum(1 for rid in sent if rid not in finals),
        "duplicate_finals": sum(1 for rid in sent if len(finals.get(rid, [])) > 1),
        "error_finals": dict(errors),
        "gap_s": round(longest_gap([f[0] for f in finals.values()], pause_at, end), 3),
        "stall_s": round(max(during, default=0.0) - base, 3),
        "latency_s": {"p50_before": round(base, 4),
                      "p50_during": round(statistics.median(during), 4) if during else None,
                      "max_during": round(max(during, default=0.0), 4)},
    }


def pause_under_load(state: Path, index: Path, *, pause: float = 20.0,
                     sessions: int = 50) -> dict[str, Any]:
    """The scenario on a stack of its own in `state`, the knowledge base in `index`:
    returning sessions (1,000 requests in 60 s), or new ones (`sessions` 0; module doc)."""
    state.mkdir(parents=True, exist_ok=True)
    if sessions:
        return asyncio.run(_load(state, index, pause, 1000 / 60, 20.0, 20.0, sessions))
    return asyncio.run(_load(state, index, pause, 10.0, 3.0, 5.0, 0))


def run(*, pause: float = 20.0, sessions: int = 50) -> dict[str, Any]:
    """The scenario on a stack of its own, the knowledge base ingested first."""
    import tempfile

    from services.retriever.indexing.embedded_ingest import ingest
    from shared.encoders.embeddings import SentenceTransformerEncoder

    with tempfile.TemporaryDirectory(prefix="ir-pause-") as tmp:
        ingest(Path(__file__).resolve().parents[2] / "kb" / "avap", Path(tmp) / "index",
               SentenceTransformerEncoder(), progress=False)
        return pause_under_load(Path(tmp) / "state", Path(tmp) / "index", pause=pause,
                                sessions=sessions)


if __name__ == "__main__":
    import json

    print(json.dumps(run(pause=float(os.environ.get("PAUSE_S", "20")),
                         sessions=int(os.environ.get("SESSIONS", "50")))))
