"""Scaling benchmark: messages/s through one stage with 1, 2, 4, ... replicas.

The embedded stack (authentication on), then for each replica count and repetition:
the pipeline stream emptied, N fresh worker processes of the stage, a backlog on the
stage's subject kept above `backlog` messages by a feeder, and, once all N replicas
answer `$SRV.PING` and a warm-up has passed, the stage's throughput over `window`
seconds, read from the replicas' own counts on the services API (`$SRV.STATS`: the
same figures `intentroute status` shows). Nothing downstream runs: the stage's
hand-offs stay in the stream until the next run empties it.

The envelopes are what the gateway (classifier) or the classifier (retriever) hands
on, stamped with the deployment's admission key; the queries are the routing evaluation
sets' (text the classifier never trained on), each made distinct so that no encoder
cache answers for the models. With `models` the
stages run as in production (Layer-2 embedding head; hybrid retrieval with the
embedding relevance check); without, rules only and BM25.

Keys: stage, replicas, cores, models, window_s, points (per replica count: the runs'
msgs_per_s, their median, the median p95 of the stage's handling time, the CPU time
the replicas spent per message and how many cores they got between them, whether the
backlog ever ran dry), speedup (median vs one replica), flattens_at (the first count
that adds less than 15 % over the previous one) and load_avg (the machine's 1-minute
load average before and after: the machine is shared, figures are noisy).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
import nats
from nats.aio.client import Client

from intentroute.stack import embedded_stack
from intentroute.stack.nats_users import admin_kwargs, auth_files, ops_kwargs, service_env
from intentroute.status import Instance, gather, parse_stats
from shared.auth.admission import Admission
from shared.contracts import pipeline
from shared.contracts.pipeline import Admitted, Routed
from shared.contracts.request import AgentRequest
from shared.contracts.routing import Layer as RoutingLayer
from shared.contracts.routing import QueryType, RoutingDecision, slot_for
from shared.runtime.signals import bucket_delta, merge_buckets, quantile
from shared.runtime.streams import ensure_streams

REPO = Path(__file__).resolve().parents[2]
STAGES = {"classifier": pipeline.CLASSIFY_SUBJECT, "retriever": pipeline.RETRIEVE_SUBJECT}
AGENT = "bench-scaling"
FLAT = 0.15


def queries() -> list[str]:
    """Query-like texts the classifier never trained on (the routing evaluation sets)."""
    from bench.classifier_embedding import texts_for_bench

    return list(dict.fromkeys(texts_for_bench(5000)))


class Feeder:
    """Envelopes for the stage under test, stamped as the pipeline stamps them."""

    def __init__(self, stage: str, admission: Admission) -> None:
        self.stage = stage
        self.subject = STAGES[stage]
        self.admission = admission
        self.texts = queries()
        self.sent = 0

    def envelope(self) -> bytes:
        i = self.sent
        self.sent += 1
        # Every text distinct: the encoders' caches must not answer for the models.
        text = self.texts[i % len(self.texts)]
        if i >= len(self.texts):
            text = f"{text} [{i // len(self.texts)}]"
        req = AgentRequest(request_id=uuid.uuid4().hex, session_id=f"scale-{i % 64}",
                           agent_id=AGENT, query=text)
        now = time.time()
        env: Admitted | Routed
        if self.stage == "classifier":
            env = Admitted(request=req, accepted_at=now, trusted=True, deadline=now + 600)
        else:
            decision = RoutingDecision(type=QueryType.RETRIEVAL, layer=RoutingLayer.RULES,
                                       confidence=1.0, model_slot=slot_for(QueryType.RETRIEVAL))
            env = Routed(request=req, accepted_at=now, decision=decision, deadline=now + 600)
        self.admission.stamp(env)
        return msgspec.json.encode(env)

    async def top_up(self, nc: Client, backlog: int, stop: asyncio.Event,
                     dry: list[bool]) -> None:
        """Keep at least `backlog` messages waiting; note when the stage ran dry."""
        js = nc.jetstream()
        durable = self.stage
        while not stop.is_set():
            info = await js.consumer_info(pipeline.STREAM, durable)
            pending = info.num_pending or 0
            if pending == 0 and self.sent:
                dry.append(True)
            if pending < backlog:
                for _ in range(2 * backlog - pending):
                    await nc.publish(self.subject, self.envelope())
                await nc.flush()
            await asyncio.sleep(0.1)


def _handled(instances: list[Instance]) -> dict[str, Instance]:
    return {i.id: i for i in instances}


async def _stats(ops: Client, stage: str) -> list[Instance]:
    replies = await gather(ops, f"$SRV.STATS.intentroute-{stage}", timeout=2.0, quiet=0.3)
    return [i for r in replies for i in parse_stats(r)]


def spawn(stage: str, replicas: int, env: dict[str, str]) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-m", "intentroute.cli", "worker", stage], env=env)
            for _ in range(replicas)]


def cpu_seconds(procs: list[subprocess.Popen[bytes]]) -> float:
    """User + system CPU time of the worker processes so far (all their threads)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p in procs:
        try:
            fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(30)


async def one_run(nats_url: str, state: Path, stage: str, replicas: int, *, backlog: int,
                  window: float, warmup: float, env: dict[str, str]) -> dict[str, Any]:
    admin = await nats.connect(nats_url, **admin_kwargs(state))
    ops = await nats.connect(nats_url, **ops_kwargs(state))
    js = admin.jetstream()
    await js.purge_stream(pipeline.STREAM)
    key = auth_files(state).admission_key.read_text(encoding="utf-8")
    feeder = Feeder(stage, Admission(key.encode()))
    procs = spawn(stage, replicas, {**env, **service_env(state, stage)})
    stop, dry = asyncio.Event(), list[bool]()
    feeding: asyncio.Task[None] | None = None
    try:
        started = time.monotonic()
        while len(await gather(ops, f"$SRV.PING.intentroute-{stage}", timeout=0.5,
                               quiet=0.2)) < replicas:
            if time.monotonic() - started > 180:
                raise TimeoutError(f"{replicas} {stage} replicas did not start")
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"a {stage} worker exited while starting")
            await asyncio.sleep(0.5)
        feeding = asyncio.create_task(feeder.top_up(admin, backlog, stop, dry))
        await asyncio.sleep(warmup)
        dry.clear()
        before = _handled(await _stats(ops, stage))
        t0, cpu0 = time.monotonic(), cpu_seconds(procs)
        await asyncio.sleep(window)
        after = _handled(await _stats(ops, stage))
        elapsed, cpu = time.monotonic() - t0, cpu_seconds(procs) - cpu0
    finally:
        stop.set()
        if feeding is not None:
            await feeding
        await asyncio.to_thread(stop_all, procs)
        await js.purge_stream(pipeline.STREAM)
        await ops.drain()
        await admin.drain()
    handled = sum(i.handled - before[i.id].handled for i in after.values() if i.id in before)
    errors = sum(i.errors - before[i.id].errors for i in after.values() if i.id in before)
    window_buckets = merge_buckets(bucket_delta(i.buckets, before[i.id].buckets)
                                   for i in after.values() if i.id in before)
    p95 = quantile(window_buckets, 0.95)
    return {"msgs_per_s": round(handled / elapsed, 1), "errors": errors,
            # CPU the replicas used per message (less sensitive to a busy machine than
            # the rate) and how many cores they had between them.
            "cpu_ms_per_msg": round(cpu * 1000 / max(1, handled), 3),
            "cores_used": round(cpu / elapsed, 2),
            "p95_ms": None if p95 is None else round(p95 * 1000, 2),
            "replicas_seen": len(after), "ran_dry": bool(dry)}


async def _prepare(nats_url: str, state: Path) -> None:
    async with await nats.connect(nats_url, **admin_kwargs(state)) as admin:
        await ensure_streams(admin.jetstream(), 3600)


def run(stage: str = "classifier", replicas: tuple[int, ...] = (1, 2, 4), repeats: int = 3,
        *, window: float = 8.0, warmup: float = 3.0, backlog: int = 1000,
        models: bool = True) -> dict[str, Any]:
    """See the module doc."""
    from services.retriever.indexing.embedded_ingest import ingest
    from shared.encoders.embeddings import SentenceTransformerEncoder
    from shared.store import migrate

    if stage not in STAGES:
        raise ValueError(f"stage must be one of {', '.join(STAGES)}")
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ir-scaling-") as tmp:
        state = Path(tmp)
        if stage == "retriever":
            ingest(REPO / "kb" / "avap", state / "index", SentenceTransformerEncoder(),
                   progress=False)
        with embedded_stack(state) as (nats_url, db_url):
            migrate(db_url)
            asyncio.run(_prepare(nats_url, state))
            env = dict(os.environ, NATS_URL=nats_url, DATABASE_URL=db_url,
                       INTENTROUTE_HOME=str(state), INDEX_DIR=str(state / "index"),
                       AVAP_PARSER_TIMEOUT="0", LOG_LEVEL="WARNING")
            env.pop("METRICS_PORT", None)
            if not models:
                env.update(RETRIEVER_METHOD="bm25", CLASSIFIER_HEADS_DIR="")
            points = []
            for n in replicas:
                runs = [asyncio.run(one_run(nats_url, state, stage, n, backlog=backlog,
                                            window=window, warmup=warmup, env=env))
                        for _ in range(repeats)]
                rates = [r["msgs_per_s"] for r in runs]
                p95s = [r["p95_ms"] for r in runs if r["p95_ms"] is not None]
                points.append({
                    "replicas": n, "msgs_per_s": rates,
                    "median_msgs_per_s": round(statistics.median(rates), 1),
                    "median_p95_ms": round(statistics.median(p95s), 2) if p95s else None,
                    "median_cpu_ms_per_msg": statistics.median(
                        r["cpu_ms_per_msg"] for r in runs),
                    "cores_used": [r["cores_used"] for r in runs],
                    "errors": sum(r["errors"] for r in runs),
                    "ran_dry": any(r["ran_dry"] for r in runs)})
    base = points[0]["median_msgs_per_s"] or 1.0
    flattens = next((b["replicas"] for a, b in itertools.pairwise(points)
                     if b["median_msgs_per_s"] < a["median_msgs_per_s"] * (1 + FLAT)), None)
    return {"stage": stage, "replicas": list(replicas), "repeats": repeats,
            "cores": os.cpu_count(), "models": models, "window_s": window,
            "points": points,
            "speedup": {str(p["replicas"]): round(p["median_msgs_per_s"] / base, 2)
                        for p in points},
            "flattens_at": flattens,
            "load_avg": {"before": round(load_before, 2),
                         "after": round(os.getloadavg()[0], 2)}}


if __name__ == "__main__":
    print(json.dumps(run()))
