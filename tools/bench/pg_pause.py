"""Postgres paused: SIGSTOP of the postgres server (every process of it) for 20 s under
steady load of questions that need no database (RETRIEVAL, each on a new session: no
history to read); what the answers felt.

Scenario `postgres_pause_20s` of `intentroute bench chaos --json` (bench/chaos.py), on
a stack of its own (auth on, one replica of each worker the questions go through, the
echo generator). Keys: sent, answered_once (exactly one final seen live), lost (no final
within the deadline), duplicate_finals, error_finals, stall_s (the longest any question
asked during the pause waited for its final, less the median before it), latency_s
(p50 before, p50 / max during the pause), rows_missing (answered requests without their
request-log row once the row writer is done, 30 s at most).
"""

from __future__ import annotations

import asyncio
import contextlib
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


async def _load(state: Path, index: Path, pause: float, rate: float,
                before: float, after: float) -> dict[str, Any]:
    import asyncpg
    import nats

    from intentroute.stack import NatsServer, PostgresServer
    from intentroute.stack.nats_users import admin_kwargs, auth_files, service_env, sync_agents
    from intentroute.supervisor import Supervisor
    from intentroute.workers import wait_for_consumers
    from shared.client.caller import publish_until_stored
    from shared.contracts.codec import decode_chunk
    from shared.contracts.request import AgentRequest
    from shared.contracts.response import agent_responses
    from shared.runtime.streams import ensure_streams
    from shared.store import asyncpg_dsn, migrate
    from shared.store.agents import AgentStore

    natsd = NatsServer(state / "nats", creds_dir=auth_files(state).creds_dir)
    pg = PostgresServer(state / "postgres")
    natsd.start()
    pg.start()
    supervisor = Supervisor()
    try:
        await asyncio.to_thread(migrate, pg.url)
        agents = await AgentStore.connect(pg.url)
        try:
            cred = await agents.add(AGENT, trusted=True)
        finally:
            await agents.close()
        await sync_agents(state, pg.url)
        admin = await nats.connect(natsd.url, **admin_kwargs(state))
        await ensure_streams(admin.jetstream(), 3600)
        env = dict(os.environ, NATS_URL=natsd.url, DATABASE_URL=pg.url,
                   INTENTROUTE_HOME=str(state), INDEX_DIR=str(index), RETRIEVER_METHOD="bm25",
                   CLASSIFIER_HEADS_DIR="", GENERATOR_BACKEND="echo", LOG_LEVEL="ERROR")
        for name in WORKERS:
            supervisor.add(name, [sys.executable, "-m", "intentroute.cli", "worker", name],
                           {**env, **service_env(state, name)})
        await wait_for_consumers(admin, list(WORKERS))
        await admin.close()
        nc = await nats.connect(natsd.url, **cred.nats)
        finals: dict[str, list[float]] = {}
        errors: Counter[str] = Counter()

        async def on_chunk(msg: Any) -> None:
            chunk = decode_chunk(msg.data)
            if chunk.is_final:
                finals.setdefault(chunk.request_id, []).append(time.monotonic())
                if chunk.error:
                    errors[chunk.error.code] += 1

        await nc.subscribe(agent_responses(AGENT), cb=on_chunk)
        sent: dict[str, float] = {}
        tasks = set()
        start = time.monotonic()
        pause_at, resume_at = start + before, start + before + pause
        stopped = contextlib.ExitStack()
        was_paused = False
        while (now := time.monotonic()) < resume_at + after:
            if pause_at <= now < resume_at and not was_paused:
                assert pg.proc is not None
                stopped.enter_context(paused(pg.proc.pid))
                was_paused = True
            elif now >= resume_at:
                stopped.close()
            req = AgentRequest(request_id=uuid.uuid4().hex, session_id=uuid.uuid4().hex[:12],
                               agent_id=AGENT, query="What does addParam do?",
                               query_type="RETRIEVAL")
            sent[req.request_id] = time.monotonic()
            tasks.add(asyncio.create_task(publish_until_stored(
                nc, req, give_up_at=time.monotonic() + 60)))
            await asyncio.sleep(1 / rate)
        stopped.close()
        await asyncio.gather(*tasks, return_exceptions=True)
        for _ in range(240):  # every question answered, or 60 s
            if all(rid in finals for rid in sent):
                break
            await asyncio.sleep(0.25)
        await asyncio.sleep(1.0)  # a second final, if any, would arrive now
        await nc.drain()
        conn = await asyncpg.connect(asyncpg_dsn(pg.url))
        try:
            for _ in range(120):
                logged = {r["request_id"] for r in await conn.fetch(
                    "SELECT request_id FROM request_log WHERE agent_id = $1", AGENT)}
                if all(rid in logged for rid in finals):
                    break
                await asyncio.sleep(0.25)
        finally:
            await conn.close()
    finally:
        supervisor.stop(timeout=15)
        natsd.stop()
        pg.stop()
    waits = {rid: finals[rid][0] - at for rid, at in sent.items() if rid in finals}
    calm = [w for rid, w in waits.items() if sent[rid] < pause_at]
    during = [w for rid, w in waits.items() if pause_at <= sent[rid] < resume_at]
    base = statistics.median(calm) if calm else 0.0
    return {
        "pause_s": pause,
        "sent": len(sent),
        "answered_once": sum(1 for rid in sent if len(finals.get(rid, [])) == 1),
        "lost": sum(1 for rid in sent if rid not in finals),
        "duplicate_finals": sum(1 for rid in sent if len(finals.get(rid, [])) > 1),
        "error_finals": dict(errors),
        "stall_s": round(max(during, default=0.0) - base, 3),
        "latency_s": {"p50_before": round(base, 4),
                      "p50_during": round(statistics.median(during), 4) if during else None,
                      "max_during": round(max(during, default=0.0), 4)},
        "rows_missing": sum(1 for rid in finals if rid not in logged),
    }


def pause_under_load(state: Path, index: Path, *, pause: float = 20.0, rate: float = 10.0,
                     before: float = 3.0, after: float = 5.0) -> dict[str, Any]:
    """The scenario on a stack of its own in `state`, the knowledge base in `index`."""
    state.mkdir(parents=True, exist_ok=True)
    return asyncio.run(_load(state, index, pause, rate, before, after))


if __name__ == "__main__":
    import json
    import tempfile

    from services.retriever.indexing.embedded_ingest import ingest
    from shared.encoders.embeddings import SentenceTransformerEncoder

    with tempfile.TemporaryDirectory(prefix="ir-pause-") as tmp:
        ingest(Path(__file__).resolve().parents[2] / "kb" / "avap", Path(tmp) / "index",
               SentenceTransformerEncoder(), progress=False)
        print(json.dumps(pause_under_load(Path(tmp) / "state", Path(tmp) / "index",
                                          pause=float(os.environ.get("PAUSE_S", "20")))))
