"""Classifier benchmark: Layer 1 decisions/s, Layer 2 single-message p50, and
decisions/s through the real worker (NATS + Postgres) with 64 concurrent requests."""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.classifier_embedding import texts_for_bench
from services.classifier.cascade import Cascade
from shared.contracts.request import AgentRequest

RULE_QUERIES = [
    "You have a project usage percentage of 20%, provide a recommendation",
    "cuántas llamadas llevo este mes?",
    "What does addParam do in AVAP?",
    "Write an AVAP endpoint that reads userId and returns it",
    "en menos palabras",
    "my invoice for October looks wrong",
]
WORKER_QUERIES = [
    "What does addParam do in AVAP?",
    "Write an AVAP endpoint that reads userId and returns it",
    "cómo funciona startLoop",
    "hazlo más corto por favor",
    "genera un script que calcule un descuento del 20%",
    "which comparators does if() accept",
    "how many API calls did I make this month",
    "explain the try and exception blocks",
]


def rules_per_s(seconds: float = 0.4, rounds: int = 5) -> float:
    """Median over `rounds` windows: one window can land on a busy second."""
    cascade = Cascade()
    reqs = [AgentRequest(request_id="b", session_id="s", agent_id="a", query=q)
            for q in RULE_QUERIES]
    rates = []
    for _ in range(rounds):
        n = 0
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for req in reqs:
                cascade.decide_fast(req, trusted=True)
            n += len(reqs)
        rates.append(n / seconds)
    return round(statistics.median(rates), 1)


async def _worker_throughput(nats_url: str, db_url: str, total: int, concurrency: int
                             ) -> float:
    import nats
    from faststream import TestApp

    from services.classifier.app import create_app
    from services.classifier.settings import ClassifierSettings
    from shared.auth.admission import Admission
    from shared.contracts.codec import decode_routed, encode
    from shared.contracts.pipeline import CLASSIFY_SUBJECT, Admitted
    from shared.runtime.streams import ensure_streams

    admission = Admission(b"")

    env = {**os.environ, "NATS_URL": nats_url, "DATABASE_URL": db_url, "LOG_LEVEL": "WARNING",
           "CLASSIFIER_BATCH": str(concurrency)}
    app = create_app(ClassifierSettings.from_env(env))
    nc = await nats.connect(nats_url)
    await ensure_streams(nc.jetstream(), 600)
    done: dict[str, asyncio.Future[None]] = {}

    async def on_out(msg: Any) -> None:
        rid = decode_routed(msg.data).request.request_id
        fut = done.pop(rid, None)
        if fut and not fut.done():
            fut.set_result(None)

    await nc.subscribe("intentroute.stage.retrieve", cb=on_out)
    await nc.subscribe("intentroute.stage.generate.*", cb=on_out)
    js = nc.jetstream()
    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(concurrency)
    # Distinct messages: the encoder's LRU cache must not answer for Layer 2.
    texts = WORKER_QUERIES + texts_for_bench(total + concurrency)

    async def one(i: int) -> None:
        async with sem:
            req = AgentRequest(request_id=uuid.uuid4().hex, session_id=f"b{i % 64}",
                               agent_id="bench", query=texts[i])
            fut = loop.create_future()
            done[req.request_id] = fut
            env = Admitted(request=req, accepted_at=0.0)
            admission.stamp(env)  # the workers here run without a key, as on an open server
            await js.publish(CLASSIFY_SUBJECT, encode(env))
            await asyncio.wait_for(fut, 60)

    async with TestApp(app):
        await asyncio.gather(*(one(i) for i in range(concurrency)))  # warm-up
        started = time.perf_counter()
        await asyncio.gather(*(one(concurrency + i) for i in range(total)))
        elapsed = time.perf_counter() - started
    await nc.drain()
    return round(total / elapsed, 1)


def run(total: int = 2000, concurrency: int = 64) -> dict[str, Any]:
    from bench.classifier_embedding import embedding_latency
    from intentroute.stack import embedded_stack
    from shared.store import migrate

    result: dict[str, Any] = {"rules_per_s": rules_per_s()}
    result.update(embedding_latency())
    if result["early_exit_share"]:  # what a message the early exit is unsure of costs
        full = embedding_latency(early_exit=False)
        result["embedding_full_encoder_ms_p50"] = full["embedding_ms_p50"]
    # The other encoder precisions a head can be trained with, same texts.
    for precision in sorted({"fp32", "int8", "int8-block"} - {result["precision"]}):
        other = embedding_latency(precision=precision)
        key = precision.replace("-", "_")
        result[f"embedding_{key}_ms_p50"] = other["embedding_ms_p50"]
        result[f"embedding_{key}_ms_p99"] = other["embedding_ms_p99"]
    with tempfile.TemporaryDirectory(prefix="ir-bench-cls-") as tmp, embedded_stack(
        Path(tmp), auth=False
    ) as (nats_url, db_url):
        migrate(db_url)
        result["worker_decisions_per_s"] = asyncio.run(
            _worker_throughput(nats_url, db_url, total, concurrency)
        )
    result["concurrency"] = concurrency
    return result


if __name__ == "__main__":
    import json

    print(json.dumps(run()))
