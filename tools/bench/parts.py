"""`bench parts`: the time to the first part's first text of a message carrying several
requests, against a message of its first request alone (issue 34).

Embedded NATS (authentication on) and Postgres, every stage worker as its own process,
the classifier with Layer 2 as shipped (the splitter, then each part routed by the
cascade), BM25 retrieval, the generators on the echo backend streaming in four pieces
over `echo_delay` seconds (a fast model: the figures are the pipeline's own time plus a
first piece the same for every message). One agent, not trusted, a new session per
message. In each round it asks, in an order that turns round by round:

* `single`: a RETRIEVAL question alone ("explain what addVar does");
* `two`: that question, then a PLATFORM one;
* `three`: that question, then a CODE_GENERATION and a PLATFORM one;

and times, from the publish, the first chunk of answer text (a TEXT chunk, or a final
chunk with text; not a part marker, whose text is only the part's heading), the first
part marker, and the final chunk. Reported: each kind's p50 and p90 of those, the
ratios of the split messages' first-text p50 to the single one's (the issue's bound:
1.2), the rounds, and how many split messages were not answered part by part.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
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
from intentroute.stack import embedded_stack
from intentroute.workers import STAGES, wait_for_consumers
from shared.client.caller import is_text, publish_request
from shared.common.settings import nats_servers
from shared.contracts.codec import decode_chunk
from shared.contracts.request import AgentRequest
from shared.contracts.response import ChunkKind, ResponseChunk, agent_responses
from shared.runtime.streams import ensure_streams

REPO = Path(__file__).resolve().parents[2]
AGENT = "bench-parts"
FIRST = "explain what addVar does"
MESSAGES = {
    "single": FIRST,
    "two": f"{FIRST}; also, how much quota do I have left?",
    "three": f"{FIRST}, then write an endpoint that returns a total; also, can you send "
             "me my last invoice?",
}
PARTS = {"single": 0, "two": 2, "three": 3}
CONTEXT = "quota: 1200 of 5000 requests left this month; invoice 2026-10: 12.40 EUR"
BOUND = 1.2


class Timed(NamedTuple):
    """One message's times (ms after its publish); None: no such chunk."""

    first_text: float | None
    first_marker: float | None
    final: float
    parts: int


class _Watch:
    def __init__(self, started: float) -> None:
        self.started = started
        self.first_text: float | None = None
        self.first_marker: float | None = None
        self.done: asyncio.Future[tuple[ResponseChunk, float]] = (
            asyncio.get_running_loop().create_future())

    def ms(self) -> float:
        return round((time.perf_counter() - self.started) * 1000, 3)

    def see(self, chunk: ResponseChunk) -> None:
        if chunk.kind == ChunkKind.PART:
            if self.first_marker is None:
                self.first_marker = self.ms()
        elif self.first_text is None and is_text(chunk) and chunk.text:
            self.first_text = self.ms()
        if chunk.is_final and not self.done.done():
            self.done.set_result((chunk, self.ms()))


class Caller:
    """Asks one message at a time and times its chunks as they arrive."""

    def __init__(self) -> None:
        self.watching: dict[str, _Watch] = {}
        self.nc: Any = None

    async def connect(self, servers: list[str], kwargs: dict[str, Any]) -> None:
        self.nc = await nats.connect(servers, **kwargs)
        await self.nc.subscribe(agent_responses(AGENT), cb=self._on_chunk)

    async def _on_chunk(self, msg: Msg) -> None:
        chunk = decode_chunk(msg.data)
        watch = self.watching.get(chunk.request_id)
        if watch is not None:
            watch.see(chunk)

    async def ask(self, query: str) -> Timed:
        req = AgentRequest(request_id=uuid.uuid4().hex, session_id=f"s-{uuid.uuid4().hex[:8]}",
                           agent_id=AGENT, query=query, extra_context=CONTEXT)
        watch = self.watching[req.request_id] = _Watch(time.perf_counter())
        await publish_request(self.nc, req)
        final, at = await asyncio.wait_for(watch.done, 60)
        del self.watching[req.request_id]
        if final.error is not None:
            raise RuntimeError(f"{query!r} answered {final.error.code}: {final.error.message}")
        return Timed(watch.first_text, watch.first_marker, at, len(final.parts))

    async def close(self) -> None:
        await self.nc.drain()


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


def _figures(kind: str, timed: list[Timed]) -> dict[str, Any]:
    first = [t.first_text for t in timed if t.first_text is not None]
    markers = [t.first_marker for t in timed if t.first_marker is not None]
    finals = [t.final for t in timed]
    out: dict[str, Any] = {
        "first_text_ms_p50": _pct(first, 0.5), "first_text_ms_p90": _pct(first, 0.9),
        "final_ms_p50": _pct(finals, 0.5),
    }
    if PARTS[kind]:
        out["first_marker_ms_p50"] = _pct(markers, 0.5)
        out["not_split"] = sum(t.parts != PARTS[kind] for t in timed)
    return out


async def _measure(servers: list[str], creds: dict[str, dict[str, Any]], rounds: int,
                   warmup: int) -> dict[str, Any]:
    admin = await nats.connect(servers, **creds["admin"])
    await wait_for_consumers(admin, list(STAGES))
    await admin.drain()
    caller = Caller()
    await caller.connect(servers, creds[AGENT])
    kinds = list(MESSAGES)
    timed: dict[str, list[Timed]] = {kind: [] for kind in kinds}
    try:
        for r in range(warmup + rounds):
            # Each kind first in turn: alike conditions for all three.
            order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
            for kind in order:
                got = await caller.ask(MESSAGES[kind])
                if r >= warmup:
                    timed[kind].append(got)
    finally:
        await caller.close()
    figures = {kind: _figures(kind, values) for kind, values in timed.items()}
    single = figures["single"]["first_text_ms_p50"]
    ratios = {f"ratio_{kind}": round(figures[kind]["first_text_ms_p50"] / single, 3)
              for kind in ("two", "three") if single and figures[kind]["first_text_ms_p50"]}
    return {"single_first_text_ms_p50": single,
            "two_first_text_ms_p50": figures["two"]["first_text_ms_p50"],
            "three_first_text_ms_p50": figures["three"]["first_text_ms_p50"],
            **ratios, "bound": BOUND, "rounds": rounds, "warmup_rounds": warmup,
            "by_kind": figures}


async def _setup(state: Path, db_url: str, nats_url: str) -> dict[str, dict[str, Any]]:
    from intentroute.stack.nats_users import admin_kwargs, sync_agents
    from shared.store.agents import AgentStore

    store = await AgentStore.connect(db_url)
    try:
        cred = await store.add(AGENT, trusted=False)
    finally:
        await store.close()
    await sync_agents(state, db_url)
    kwargs: dict[str, dict[str, Any]] = {"admin": admin_kwargs(state), AGENT: dict(cred.nats)}
    await until_admitted(nats_servers(nats_url), kwargs[AGENT])
    async with await nats.connect(nats_url, **kwargs["admin"]) as admin:
        await ensure_streams(admin.jetstream(), 3600, 1)
    return kwargs


def run(rounds: int = 30, warmup: int = 3, echo_delay: float = 0.04) -> dict[str, Any]:
    """`rounds` measured rounds of the three messages after `warmup` rounds not counted;
    `echo_delay`: seconds the echo backend spreads an answer's four pieces over."""
    from intentroute.stack.nats_users import service_env
    from services.retriever.indexing.embedded_ingest import ingest
    from shared.encoders.fast import batch_fast_encoder
    from shared.store import migrate

    with tempfile.TemporaryDirectory(prefix="ir-bench-parts-") as tmp:
        state = Path(tmp)
        kb, index = state / "kb", state / "index"
        shutil.copytree(REPO / "kb" / "avap", kb)
        ingest(kb, index, batch_fast_encoder("all-MiniLM-L6-v2"), progress=False)
        with embedded_stack(state, auth=True) as (nats_url, db_url):
            migrate(db_url)
            creds = asyncio.run(_setup(state, db_url, nats_url))
            env = dict(os.environ, NATS_URL=nats_url, DATABASE_URL=db_url,
                       INTENTROUTE_HOME=str(state), INDEX_DIR=str(index),
                       RETRIEVER_METHOD="bm25", LOG_LEVEL="WARNING", HF_HUB_OFFLINE="1",
                       GENERATOR_BACKEND="echo", GENERATOR_ECHO_DELAY=str(echo_delay),
                       AVAP_PARSER_TIMEOUT="0")
            for name in ("OLLAMA_HOST", "OPENAI_BASE_URL"):
                env.pop(name, None)
            procs = [
                subprocess.Popen([sys.executable, "-m", "intentroute.cli", "worker", name],
                                 env={**env, **service_env(state, name)})
                for name in STAGES
            ]
            try:
                result = uvloop.run(_measure(nats_servers(nats_url), creds, rounds, warmup))
            finally:
                for p in procs:
                    p.terminate()
                for p in procs:
                    p.wait(15)
    result["echo_delay_s"] = echo_delay
    result["load_average"] = round(os.getloadavg()[0], 2)
    return result


if __name__ == "__main__":
    print(json.dumps(run()))
