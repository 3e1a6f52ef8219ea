"""Pipeline benchmark: raw NATS floor, end-to-end latency, sustained throughput.

Every worker runs as its own process (as in production) on the embedded servers,
with the generator on the instant echo backend and the retriever on BM25, so the
figures measure the bus, the stores and the workers' own overhead; `fleet=1` or `2`
(`--fleet`) runs the generators on a declared fleet of one or two OpenAI-compatible
backends (the fake provider, instant answers; bench/pipeline_fleet.py) instead. As in production,
authentication and permissions are on: the workers connect as their service users,
the requests come from two agents (`bench-seq` for latency, `bench-load` for
throughput) with their own credentials; `auth=False` (`--no-auth`) runs the same on
an open server. Per-agent accounting is on, as in production; `accounting=False`
(`--no-accounting`) runs the workers with ACCOUNTING=off. The servers are durable as
`intentroute up` runs them (Postgres with fsync and synchronous commit, JetStream synced
every `sync_interval`); `nats_cluster=3` runs NATS as a three-node cluster with every
stream replicated three times.

Keys: floor_ms (also floor_rtt_ms_p50: the median of 500 raw NATS request/replies through
the same server, in the same run, before the pipeline's requests), e2e_ms_p50 / p99
(sequential requests, publish to final chunk), e2e_p50_over_floor (e2e_ms_p50 over
floor_ms), js_publish_ack_ms and pg_commit_ms (a hop's primitives, the same run:
a JetStream publish acked by a file stream, one committed INSERT),
limited_agent_e2e_ms_p50 / p99, throughput_rps, stage_ms_p50,
fleet_backends (0: echo), answered_by (the request log's answers by the model that gave
them: with a fleet, `first/ok` unless a request fell back).
"""

from __future__ import annotations

import asyncio
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

import nats
import uvloop
from nats.aio.client import Client
from nats.aio.msg import Msg

from bench import pipeline_fleet
from bench.admitted import until_admitted
from intentroute.stack import DEFAULT_SYNC_INTERVAL, embedded_stack
from intentroute.workers import DOORS, STAGES, wait_for_consumers
from shared.client.caller import publish_request
from shared.common.settings import nats_servers
from shared.contracts.codec import decode_chunk
from shared.contracts.request import AgentRequest
from shared.contracts.response import agent_responses
from shared.runtime.streams import ensure_streams

REPO = Path(__file__).resolve().parents[2]
# Per-agent limits configured but never reached by this load, and all off.
LIMITS_NOT_REACHED = {"LIMIT_RATE": "100000/s", "LIMIT_MAX_INFLIGHT": "100000",
                      "LIMIT_TOKENS_PER_MIN": "1000000000", "LIMIT_BUDGET_DAY": "1e9",
                      "LIMIT_BUDGET_MONTH": "1e9"}
LIMITS_OFF = {name: "off" for name in ("LIMIT_RATE", "LIMIT_MAX_INFLIGHT",
                                       "LIMIT_TOKENS_PER_MIN", "LIMIT_BUDGET_DAY",
                                       "LIMIT_BUDGET_MONTH")}
AGENTS = ("bench-load", "bench-seq", "bench-limited")
# The agent whose own policy configures every limit far above this load (whatever the
# global defaults say), asked in turn with bench-seq in the sequential run: the two
# agents' latencies compare a limited request with an unlimited one under the same
# conditions, which runs of their own cannot (one configuration's e2e p50 spread
# over 5.1-9.4 ms across runs here, on a machine with nothing else to do).
LIMITED_AGENT = "bench-limited"
LIMITED_POLICY = ["rate=100000/s", "burst=100000", "max_inflight=100000",
                  "tokens_per_min=1000000000", "budget_day=1e9", "budget_month=1e9"]
# One of each type; CODE_GENERATION adds the validator hop.
MIX: list[dict[str, str | None]] = [
    {"query": "What does addParam do?"},
    {"query": "You have a project usage percentage of 20%, give one tip",
     "extra_context": "usage=20%"},
    {"query": "en menos palabras", "query_type": "CONVERSATIONAL"},
    {"query": "endpoint that returns the user id", "query_type": "CODE_GENERATION"},
]


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


async def _floor(nc: Client, admin: dict[str, Any], n: int = 500) -> float:
    async def echo(msg: Msg) -> None:
        await msg.respond(msg.data)

    responder = await nats.connect(nc.connected_url.geturl(), **admin)  # type: ignore[union-attr]
    await responder.subscribe("bench.echo", cb=echo)
    await responder.flush()
    for _ in range(50):  # until the server routes the requester's first request there
        try:
            await nc.request("bench.echo", b"x", timeout=2)
            break
        except nats.errors.NoRespondersError:
            await asyncio.sleep(0.05)
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        await nc.request("bench.echo", b"x", timeout=2)
        samples.append((time.perf_counter() - t) * 1000)
    await responder.drain()
    return round(statistics.median(samples), 3)


async def _hop_floors(nc: Client, db_url: str, n: int = 300) -> dict[str, float]:
    """What one hop's primitives cost on this machine, in the same run (the profile in
    docs/explanation/performance.md): a JetStream publish acknowledged by a file stream
    like the pipeline's (`js_publish_ack_ms`), and one committed INSERT on the stack's
    Postgres, fsync and synchronous commit on (`pg_commit_ms`); medians of `n`."""
    import asyncpg

    from shared.store import asyncpg_dsn

    js = nc.jetstream()
    await js.add_stream(name="BENCH_FLOOR", subjects=["bench.floor"])
    samples = []
    try:
        for _ in range(n):
            t = time.perf_counter()
            await js.publish("bench.floor", b"x" * 512)
            samples.append((time.perf_counter() - t) * 1000)
    finally:
        await js.delete_stream("BENCH_FLOOR")
    floors = {"js_publish_ack_ms": round(statistics.median(samples), 3)}
    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        # A logged table, as the request log's (a temporary one skips the WAL: 0.1 ms).
        await conn.execute("CREATE TABLE bench_floor (id bigserial, body text)")
        samples = []
        try:
            for _ in range(n):
                t = time.perf_counter()
                await conn.execute("INSERT INTO bench_floor (body) VALUES ($1)", "x" * 512)
                samples.append((time.perf_counter() - t) * 1000)
        finally:
            await conn.execute("DROP TABLE bench_floor")
    finally:
        await conn.close()
    floors["pg_commit_ms"] = round(statistics.median(samples), 3)
    return floors


class Waiter:
    def __init__(self) -> None:
        self.pending: dict[str, asyncio.Future[float]] = {}

    async def on_chunk(self, msg: Msg) -> None:
        chunk = decode_chunk(msg.data)
        if chunk.is_final:
            fut = self.pending.pop(chunk.request_id, None)
            if fut and not fut.done():
                fut.set_result(time.perf_counter())


def _request(i: int, agent: str = "bench-load") -> AgentRequest:
    sample = MIX[i % len(MIX)]
    return AgentRequest(
        request_id=uuid.uuid4().hex, session_id=f"bench-{i % 50}", agent_id=agent,
        query=str(sample["query"]), query_type=sample.get("query_type"),
        extra_context=str(sample.get("extra_context") or ""),
    )


async def _measure(nats_url: str, db_url: str, requests: int, load: int, window: int,
                   creds: dict[str, dict[str, Any]], http_url: str = "",
                   workers: tuple[str, ...] = STAGES) -> dict[str, Any]:
    servers = nats_servers(nats_url)
    admin = await nats.connect(servers, **creds["admin"])
    await wait_for_consumers(admin, list(workers))
    floor = await _floor(admin, creds["admin"])
    hops = await _hop_floors(admin, db_url)
    callers = {agent: await nats.connect(servers, **creds[agent]) for agent in AGENTS}
    waiter = Waiter()
    for agent, nc in callers.items():
        await nc.subscribe(agent_responses(agent), cb=waiter.on_chunk)
    loop = asyncio.get_running_loop()

    asked: dict[str, tuple[float, float]] = {}

    async def ask(req: AgentRequest) -> float:
        # Keep the future: the answer may arrive (and leave `pending`) before the ack.
        fut = waiter.pending[req.request_id] = loop.create_future()
        t, at = time.perf_counter(), time.time()
        await publish_request(callers[req.agent_id], req)
        answered: float = await asyncio.wait_for(fut, 60)
        if req.agent_id == "bench-seq":
            asked[req.request_id] = (at, at + answered - t)
        return (answered - t) * 1000

    # Warm-up: every worker has fetched, connected its pool and filled caches.
    for i in range(40):
        await ask(_request(i))
    latencies: list[float] = []
    limited: list[float] = []
    for i in range(requests):  # in turn, each first every other time: alike conditions
        if i % 2:
            limited.append(await ask(_request(i, LIMITED_AGENT)))
        latencies.append(await ask(_request(i, "bench-seq")))
        if not i % 2:
            limited.append(await ask(_request(i, LIMITED_AGENT)))
    sem = asyncio.Semaphore(window)

    async def one(i: int) -> None:
        async with sem:
            await ask(_request(i))

    t = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(load)))
    elapsed = time.perf_counter() - t
    doors: dict[str, Any] = {}
    if http_url:  # --door openai: that door against this one, on the same workers
        from bench.openai_door import measure_doors

        doors = await measure_doors(servers, creds, db_url, http_url, requests=requests,
                                    load=load, window=window)
        doors["doors"]["nats"]["throughput_rps"] = round(load / elapsed, 1)
    for nc in (*callers.values(), admin):
        await nc.drain()
    stages, answered_by = await _stage_breakdown(db_url, asked)
    return {
        **doors,
        "floor_rtt_ms_p50": floor,
        # The same floor under the name issue 32 gave it, and how many floors a request's
        # whole trip through the pipeline takes (both from this run, on this machine's
        # load at the moment: a ratio travels between machines, milliseconds do not).
        "floor_ms": floor,
        "e2e_p50_over_floor": round(_pct(latencies, 0.5) / floor, 1) if floor else None,
        **hops,
        "e2e_ms_p50": _pct(latencies, 0.5),
        "e2e_ms_p99": _pct(latencies, 0.99),
        # The same requests from the agent whose policy sets every limit (LIMITED_AGENT).
        "limited_agent_e2e_ms_p50": _pct(limited, 0.5),
        "limited_agent_e2e_ms_p99": _pct(limited, 0.99),
        "throughput_rps": round(load / elapsed, 1),
        "requests": requests,
        "load": load,
        "stage_ms_p50": stages,
        "answered_by": answered_by,
    }


async def _stage_breakdown(db_url: str, asked: dict[str, tuple[float, float]]
                           ) -> tuple[dict[str, float], dict[str, int]]:
    """Median per-stage figures of the sequential requests, from the request log:
    `<stage>.at` is when the stage started (ms after acceptance), `<stage>` how long
    it worked, `admitted` from the publish to the acceptance and `after_final_row` from
    the final's row (`total_before_final`) to the final seen (the turn's write, the
    final's publish and its delivery), by `asked` (request id -> epoch seconds of the
    publish and of the final seen); and every logged answer counted by the model that
    gave it."""
    import asyncpg

    from shared.store import asyncpg_dsn

    conn = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        rows = await conn.fetch("SELECT request_id, stage_ms, total_ms, "
                                "extract(epoch FROM created_at)::float8 AS at FROM request_log "
                                "WHERE agent_id = 'bench-seq' AND outcome = 'ok'")
        answered = await conn.fetch("SELECT coalesce(answered_by, '') AS model, count(*) "
                                    "FROM request_log GROUP BY 1 ORDER BY 2 DESC")
    finally:
        await conn.close()
    values: dict[str, list[float]] = {}
    for row in rows:
        stage_ms = row["stage_ms"]
        parsed = json.loads(stage_ms) if isinstance(stage_ms, str) else stage_ms
        for key, value in parsed.items():
            values.setdefault(key, []).append(float(value))
        if row["total_ms"] is not None:
            values.setdefault("total_before_final", []).append(float(row["total_ms"]))
        if row["request_id"] in asked:
            published, seen = asked[row["request_id"]]
            values.setdefault("admitted", []).append((row["at"] - published) * 1000)
            if row["total_ms"] is not None:
                values.setdefault("after_final_row", []).append(
                    (seen - row["at"]) * 1000 - float(row["total_ms"]))
    return ({k: round(statistics.median(v), 3) for k, v in sorted(values.items())},
            {row["model"]: row["count"] for row in answered})


async def _add_agents(state: Path, db_url: str, nats_url: str, auth: bool, replicas: int,
                      chain: list[str]) -> dict[str, dict[str, Any]]:
    """The bench's agents (trusted: the mix declares types), added as users add them,
    each with the policy assignments `chain` (their model chains; none: as shipped),
    and the connect kwargs of each caller and of the admin."""
    import asyncpg

    from intentroute.stack.nats_users import admin_kwargs, sync_agents
    from shared.store.agents import AgentStore
    from shared.store.policies import update_policy

    store = await AgentStore.connect(db_url)
    try:
        creds = {agent: await store.add(agent, trusted=True) for agent in AGENTS}
    finally:
        await store.close()
    pool = await asyncpg.create_pool(db_url, min_size=1, max_size=1)
    try:
        for agent in AGENTS:
            own = LIMITED_POLICY if agent == LIMITED_AGENT else []
            if own or chain:
                await update_policy(pool, agent, [*own, *chain])
    finally:
        await pool.close()
    kwargs: dict[str, dict[str, Any]] = {name: {} for name in (*AGENTS, "admin")}
    servers = nats_servers(nats_url)
    if auth:
        await sync_agents(state, db_url)
        kwargs["admin"] = admin_kwargs(state)
        for agent, cred in creds.items():
            kwargs[agent] = dict(cred.nats)
            await until_admitted(servers, kwargs[agent])
    async with await nats.connect(servers, **kwargs["admin"]) as admin:
        await ensure_streams(admin.jetstream(), 3600, replicas)
    return kwargs


def run(requests: int = 400, load: int = 3000, window: int = 256, *, models: bool = False,
        auth: bool = True, accounting: bool = True, limits: bool = False, nats_cluster: int = 1,
        sync_interval: str = DEFAULT_SYNC_INTERVAL, door: str = "nats", fleet: int = 0
        ) -> dict[str, Any]:
    """models=False measures the transport: rules-only classifier, BM25 retriever.
    models=True runs the production cascade (Layer 2) and hybrid retrieval.
    accounting=False runs the workers with ACCOUNTING=off (what accounting costs).
    limits=True configures every per-agent limit far above this load (rate, in flight,
    tokens a minute, daily and monthly budgets, so every admission runs the whole
    check); limits=False turns them all off, as shipped. door="openai" also measures
    the OpenAI-compatible door against the NATS door (bench/openai_door.py).
    fleet=1|2 runs the generators on a fleet of that many backends, the agents' chains
    across them (bench/pipeline_fleet.py); 0 on the echo backend."""
    from intentroute.stack.nats_users import service_env
    from services.retriever.indexing.embedded_ingest import ingest
    from shared.encoders.embeddings import SentenceTransformerEncoder
    from shared.store import migrate

    with tempfile.TemporaryDirectory(prefix="ir-bench-") as tmp:
        state = Path(tmp)
        ingest(REPO / "kb" / "avap", state / "index", SentenceTransformerEncoder(), progress=False)
        replicas = min(nats_cluster, 3)
        chain = pipeline_fleet.chain_assignments(fleet) if fleet else []
        with embedded_stack(state, auth=auth, nats_cluster=nats_cluster,
                            sync_interval=sync_interval) as (nats_url, db_url), \
                pipeline_fleet.serving(state, fleet) as generator_env:
            migrate(db_url)
            creds = asyncio.run(_add_agents(state, db_url, nats_url, auth, replicas, chain))
            env = dict(os.environ, NATS_URL=nats_url, DATABASE_URL=db_url,
                       NATS_STREAM_REPLICAS=str(replicas),
                       INTENTROUTE_HOME=str(state), INDEX_DIR=str(state / "index"),
                       **generator_env, AVAP_PARSER_TIMEOUT="0", LOG_LEVEL="WARNING",
                       ACCOUNTING="on" if accounting else "off",
                       **(LIMITS_NOT_REACHED if limits else LIMITS_OFF))
            if not models:
                env.update(RETRIEVER_METHOD="bm25", CLASSIFIER_HEADS_DIR="")
            http_url = ""
            # The stages; the doors (their own process, as deployed) for `--door openai`.
            workers = STAGES
            if door == "openai":
                workers = (*STAGES, DOORS)
                from intentroute.stack import free_port

                port = free_port()
                env["GATEWAY_HTTP_LISTEN"] = f"127.0.0.1:{port}"
                http_url = f"http://127.0.0.1:{port}"
            procs = [
                subprocess.Popen([sys.executable, "-m", "intentroute.cli", "worker", name],
                                 env={**env, **(service_env(state, name) if auth else {})})
                for name in workers
            ]
            try:
                result = uvloop.run(
                    _measure(nats_url, db_url, requests, load, window, creds, http_url,
                             workers))
                result["models"] = models
                result["auth"] = auth
                result["accounting"] = accounting
                result["limits"] = limits
                result["door"] = door
                result["fleet_backends"] = fleet
                result["nats_nodes"] = nats_cluster
                result["stream_replicas"] = replicas
                result["nats_sync_interval"] = sync_interval
                return result
            finally:
                for p in procs:
                    p.terminate()
                for p in procs:
                    p.wait(15)


if __name__ == "__main__":
    print(json.dumps(run()))
