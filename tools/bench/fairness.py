"""Fairness benchmark: one agent floods, two others keep asking; what do they wait?

Loopback, authentication on (as `intentroute up`): embedded nats-server and Postgres,
two gateway replicas and one of every other worker (extractive answers, BM25 over the
demo knowledge base). Agents B and C each ask one RETRIEVAL question a second (every
`ask_every` seconds), first WARMUP seconds (not counted: a worker's first request is
its lazy start), then for `quiet` seconds alone, then while agent A publishes `flood`
RETRIEVAL questions as fast as it can, until A's flood is all answered (or `deadline` passes).

Keys: victim_where_ms (per phase, p50s of where B's and C's time went: `admitted`,
publish to admission; `<stage>.at`, admission to that stage's start; `<stage>`, its
handler's time; `total`, admission to the final's row; `latency`, publish to the final
seen), victim_p50_ms / victim_p95_ms (B's and C's answers during the flood, publish to
final chunk), victim_quiet_p95_ms (the same before it), victims_sent, flood_answered,
flood_refused (A's error finals by code), lost (requests without a final chunk at the
end), duplicate_finals (requests with two different finals), flood_s (A's first
publish to its last answer), budget_overshoot: A's spend past its daily budget, read
back from the request log (`services.gateway.limits.store.budget_overshoot`:
`overshoot`, `bound`, `spent`, `budget`, `requests`; null with `budget_day=None`).

`victim_over_quiet_p95`: victim_p95_ms over victim_quiet_p95_ms, both from this run
(target <= 3, and victim_p95_ms <= 500).

Then the `five_flooders` phase (`flooders` agents E.., 0: skipped): after A's flood,
five agents without a budget each publish `flooder_requests` RETRIEVAL questions at
once while B and C keep asking, until all are answered (or `deadline` passes). Keys
under `five_flooders`: flooders, sent, answered, refused (by code), lost, seconds,
victim_p50_ms / victim_p95_ms (B's and C's answers during it), victim_over_quiet_p95
(over the same quiet p95; target <= 3 and p95 <= 500 ms, as for one flood).

Then the `injector` phase (`injector` messages, 0: skipped): agent D, while B and C
keep asking, publishes on its own subjects with reply subjects aimed at them (its
request subject with the reply `agent.response.<victim>.<id>`, `agent.request.<victim>`
or `agent.feedback.<victim>`; its replay subject with the reply
`agent.response.<victim>.<id>`), as an agent trying to make JetStream's acknowledgement
or the gateway's replay write into another agent's answers and request queue. Keys
under `injector`: victim_p50_ms / victim_p95_ms (B's and C's answers during it),
victim_over_quiet_p95 (the ratio to their quiet p95; target <= 3 and p95 <= 500 ms),
victim_foreign_rows (rows of B's and C's request log for requests they did not send:
must be 0), victim_foreign_messages (messages seen live on B's and C's answer subjects
for requests they did not send: must be 0), sent, seconds.

Agent A has a daily budget (`budget_day`, default BUDGET_DAY cost units) priced at
FLOOD_PRICE: its answers are extractive (no model tokens), so its cost is the time
their generation took, one cost unit a millisecond. The flood reaches the budget part of the
way through (where depends on the machine's speed) and the rest of it is refused
BUDGET_EXCEEDED at admission, counted in flood_refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import nats
from nats.aio.msg import Msg

from bench import flooders
from intentroute.stack import NatsServer, PostgresServer
from intentroute.stack.nats_users import admin_kwargs, auth_files, service_env, sync_agents
from intentroute.supervisor import Supervisor
from intentroute.workers import STAGES, wait_for_consumers
from services.gateway.limits.logic import price_table
from services.gateway.limits.store import budget_overshoot
from shared.client.caller import publish_until_stored
from shared.policy.agent import AgentPolicy, Price
from shared.runtime.streams import ensure_streams
from shared.store import asyncpg_dsn, migrate
from shared.store.agents import AgentStore
from shared.store.policies import save_policy

FLOOD, VICTIMS, INJECTOR = "flood-a", ("victim-b", "victim-c"), "injector-d"
# The five-flooder phase's agents (as many as `flooders` asks for; no budget).
FLOODERS = ("flood-e", "flood-f", "flood-g", "flood-h", "flood-i")
# A's price: one cost unit per millisecond of generation of its extractive answers.
FLOOD_PRICE = {"extractive": Price(per_compute_s=1000.0)}
# A's daily budget in those units. An extractive answer took ~0.2 ms of generation
# (1,000 answered: 199 units, a 2-core machine shared with other jobs), so a flood of
# 5,000 passes it part of the way through (later on a faster machine).
BUDGET_DAY = 600.0
# Seconds B and C ask before their quiet latency is measured: a worker's first request
# pays its lazy start (~120 ms measured, the rest ~13 ms), which made the quiet p95 of
# 16 requests the cold start's and the ratio to it flattering.
WARMUP = 2.5


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)


def _over(p95: float | None, quiet: float | None) -> float | None:
    return round(p95 / quiet, 2) if p95 and quiet else None


class VictimFinals(flooders.Finals):
    """The victims' finals (bench.flooders.Finals), and every message on their answer
    subjects (`on_victims`: the subject's request id, the data), chunk or not."""

    def __init__(self) -> None:
        super().__init__()
        self.on_victims: list[tuple[str, bytes]] = []

    async def on_chunk(self, msg: Msg) -> None:
        _, _, agent, request_id = msg.subject.split(".", 3)
        if agent in VICTIMS:
            self.on_victims.append((request_id, msg.data))
        await super().on_chunk(msg)


class Fairness:
    def __init__(self, state: Path, *, flood: int, quiet: float, deadline: float,
                 env: dict[str, str], budget_day: float | None = BUDGET_DAY,
                 injector: int = 0, flooders: int = 0, flooder_requests: int = 0,
                 ask_every: float = 1.0) -> None:
        self.state = state
        self.ask_every = ask_every
        self.flood = flood
        self.flooders = FLOODERS[:flooders]
        self.flooder_requests = flooder_requests
        self.injector = injector
        self.policy = None if budget_day is None else AgentPolicy(
            budget_day=budget_day, prices=FLOOD_PRICE)
        self.quiet = quiet
        self.deadline = deadline
        self.extra_env = env
        self.nats = NatsServer(state / "nats", creds_dir=auth_files(state).creds_dir)
        self.pg = PostgresServer(state / "postgres")
        self.supervisor = Supervisor()
        self.finals = VictimFinals()
        # request id -> (agent, publish time); victims' by phase; epoch publish time.
        self.sent: dict[str, tuple[str, float]] = {}
        # The floods' results from their process (bench.flooders), by phase.
        self.floods: dict[str, dict[str, Any]] = {}
        self.pool: ProcessPoolExecutor | None = None
        self.creds: dict[str, Any] = {}
        self.sent_epoch: dict[str, float] = {}
        self.phase: dict[str, str] = {}

    async def prepare(self) -> dict[str, Any]:
        store = await AgentStore.connect(self.pg.url)
        try:  # trusted: their declared RETRIEVAL is honoured
            creds = {a: await store.add(a, trusted=True)
                     for a in (FLOOD, *VICTIMS, *self.flooders)}
            creds[INJECTOR] = await store.add(INJECTOR)
        finally:
            await store.close()
        if self.policy is not None:  # read by the gateways when they start
            conn = await asyncpg.connect(asyncpg_dsn(self.pg.url))
            try:
                await save_policy(conn, FLOOD, self.policy)
            finally:
                await conn.close()
        await sync_agents(self.state, self.pg.url)
        async with await nats.connect(self.nats.url, **admin_kwargs(self.state)) as admin:
            await ensure_streams(admin.jetstream(), 3600)
        return creds

    def start_workers(self) -> None:
        env = dict(os.environ, NATS_URL=self.nats.url, DATABASE_URL=self.pg.url,
                   INTENTROUTE_HOME=str(self.state), INDEX_DIR=str(self.state / "index"),
                   RETRIEVER_METHOD="bm25", CLASSIFIER_HEADS_DIR="", AVAP_PARSER_TIMEOUT="0",
                   LOG_LEVEL="ERROR", REQUEST_DEADLINE=str(self.deadline), **self.extra_env)
        for name in STAGES:
            for _ in range(2 if name == "gateway" else 1):
                self.supervisor.add(name, [sys.executable, "-m", "intentroute.cli", "worker",
                                           name], {**env, **service_env(self.state, name)})

    async def publish(self, nc: Any, agent: str, i: int, phase: str) -> None:
        req = flooders.request(agent, i)
        self.sent[req.request_id] = (agent, time.monotonic())
        self.sent_epoch[req.request_id] = time.time()
        self.phase[req.request_id] = phase
        with contextlib.suppress(Exception):  # never stored: counted as lost
            await publish_until_stored(nc, req, give_up_at=time.monotonic() + 30)

    async def victim(self, nc: Any, agent: str, phase: dict[str, str],
                     stop: asyncio.Event) -> None:
        i, sending = 0, set()
        while not stop.is_set():
            task = asyncio.create_task(self.publish(nc, agent, i, phase["now"]))
            sending.add(task)
            task.add_done_callback(sending.discard)
            i += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.ask_every)

    async def in_child(self, agents: tuple[str, ...], count: int) -> dict[str, Any]:
        """`agents` flood `count` requests each from the child process (bench.flooders)."""
        assert self.pool is not None
        future = self.pool.submit(flooders.flood, self.nats.url,
                                  [(agent, self.creds[agent].nats) for agent in agents],
                                  count, self.deadline)
        return await asyncio.wrap_future(future)

    async def inject(self, nc: Any) -> float:
        """Agent D's messages with reply subjects aimed at B and C (module doc); the
        seconds it took to send them."""
        started = time.monotonic()
        for i in range(self.injector):
            victim, rid = VICTIMS[i % len(VICTIMS)], uuid.uuid4().hex
            reply = (f"agent.response.{victim}.{rid}", f"agent.request.{victim}",
                     f"agent.feedback.{victim}")[i % 3]
            with contextlib.suppress(Exception):  # a refusal is what it should get
                await nc.publish(f"agent.request.{INJECTOR}",
                                 json.dumps({"request_id": rid}).encode(), reply=reply)
                await nc.publish(f"agent.replay.{INJECTOR}", rid.encode(),
                                 reply=f"agent.response.{victim}.{rid}")
            if i % 200 == 199:
                with contextlib.suppress(Exception):
                    await nc.flush()
                await asyncio.sleep(0)
        return time.monotonic() - started

    async def run(self) -> dict[str, Any]:
        creds = self.creds = await self.prepare()
        # The floods' own process, started (and its imports done) before anything is timed.
        self.pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        await asyncio.wrap_future(self.pool.submit(flooders.ready))
        self.start_workers()
        stop_supervising = asyncio.Event()

        async def supervise() -> None:
            while not stop_supervising.is_set():
                self.supervisor.poll()
                await asyncio.sleep(0.1)

        supervising = asyncio.create_task(supervise())
        conns: list[Any] = []
        try:
            async with await nats.connect(self.nats.url, **admin_kwargs(self.state)) as admin:
                await wait_for_consumers(admin, list(STAGES))
                for victim in VICTIMS:  # the floods' answers are their process's
                    await admin.subscribe(f"agent.response.{victim}.*",
                                          cb=self.finals.on_chunk)
                for agent in (*VICTIMS, INJECTOR):
                    conns.append(await nats.connect(self.nats.url, **creds[agent].nats))
                victim_ncs, injector_nc = conns[:2], conns[2]
                phase = {"now": "warmup"}
                stop = asyncio.Event()
                victims = [asyncio.create_task(self.victim(nc, agent, phase, stop))
                           for nc, agent in zip(victim_ncs, VICTIMS, strict=True)]
                await asyncio.sleep(WARMUP)
                phase["now"] = "quiet"
                await asyncio.sleep(self.quiet)
                phase["now"] = "during"
                self.floods["flood"] = await self.in_child((FLOOD,), self.flood)
                if self.flooders:
                    phase["now"] = "quiet-again"
                    await asyncio.sleep(2.0)  # the flood's last answers out of the way
                    phase["now"] = "five"
                    self.floods["five"] = await self.in_child(self.flooders,
                                                              self.flooder_requests)
                inject_s = 0.0
                if self.injector:
                    phase["now"] = "injector"
                    inject_s = await self.inject(injector_nc)
                    await asyncio.sleep(max(3.0, self.quiet / 2))  # victims keep asking
                stop.set()
                await asyncio.gather(*victims)
                # The last victims' answers, and any late duplicate.
                await asyncio.sleep(3.0)
        finally:
            for nc in conns:
                with contextlib.suppress(Exception):
                    await nc.close()
            stop_supervising.set()
            await supervising
            self.supervisor.stop(timeout=15)
            self.pool.shutdown()
        report = self.report(await self.overshoot())
        report["victim_where_ms"] = await self.where()
        if self.flooders:
            report["five_flooders"] = self.five_report(report)
        if self.injector:
            report["injector"] = await self.injector_report(report, inject_s)
        return report

    async def injector_report(self, report: dict[str, Any], seconds: float) -> dict[str, Any]:
        """The injector phase's keys (module doc), once every row is written."""
        latency = [self.finals.first[rid][0] - sent_at
                   for rid, (agent, sent_at) in self.sent.items()
                   if self.phase[rid] == "injector" and rid in self.finals.first]
        conn = await asyncpg.connect(asyncpg_dsn(self.pg.url))
        try:
            logged = await conn.fetch("SELECT agent_id, request_id FROM request_log "
                                      "WHERE agent_id = ANY($1::text[])", list(VICTIMS))
        finally:
            await conn.close()
        p95, quiet = _pct(latency, 0.95), report["victim_quiet_p95_ms"]
        return {
            "sent": self.injector,
            "seconds": round(seconds, 2),
            "victim_p50_ms": _pct(latency, 0.5),
            "victim_p95_ms": p95,
            "victim_over_quiet_p95": _over(p95, quiet),
            "victim_foreign_rows": sum(1 for r in logged if r["request_id"] not in self.sent),
            "victim_foreign_messages": sum(1 for rid, _ in self.finals.on_victims
                                           if rid not in self.sent),
        }

    def five_report(self, report: dict[str, Any]) -> dict[str, Any]:
        """The five-flooder phase's keys (module doc)."""
        latency = [self.finals.first[rid][0] - sent_at
                   for rid, (_, sent_at) in self.sent.items()
                   if self.phase[rid] == "five" and rid in self.finals.first]
        result = self.floods.get("five", {"seconds": 0.0, "agents": {}})
        counts = list(result["agents"].values())
        refused: Counter[str] = Counter()
        for one in counts:
            refused.update(one["refused"])
        p95 = _pct(latency, 0.95)
        return {
            "flooders": len(self.flooders),
            "sent": sum(one["sent"] for one in counts),
            "answered": sum(one["answered"] for one in counts),
            "refused": dict(refused),
            "lost": sum(one["lost"] for one in counts),
            "duplicate_finals": sum(one["duplicate_finals"] for one in counts),
            "seconds": round(result["seconds"], 1),
            "victim_p50_ms": _pct(latency, 0.5),
            "victim_p95_ms": p95,
            "victim_over_quiet_p95": _over(p95, report["victim_quiet_p95_ms"]),
        }

    async def where(self) -> dict[str, dict[str, float | None]]:
        """Where B's and C's time went, per phase, from their request-log rows (p50s in
        ms): `admitted` (publish to the gateway's admission: the agent's queue and the
        fair scheduler), `<stage>.at` (admission to that stage's start: every queue and
        hop before it), `<stage>` (its handler's own time), `total` (admission to the
        final's row) and `latency` (publish to the final seen)."""
        conn = await asyncpg.connect(asyncpg_dsn(self.pg.url))
        try:
            rows = await conn.fetch(
                "SELECT request_id, extract(epoch FROM created_at) AS at, stage_ms, total_ms "
                "FROM request_log WHERE agent_id = ANY($1::text[])", list(VICTIMS))
        finally:
            await conn.close()
        spans: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for row in rows:
            rid = row["request_id"]
            if rid not in self.sent_epoch or rid not in self.finals.first:
                continue
            into = spans[self.phase[rid]]
            into["admitted"].append(float(row["at"]) - self.sent_epoch[rid])
            into["latency"].append(self.finals.first[rid][0] - self.sent[rid][1])
            if row["total_ms"] is not None:
                into["total"].append(row["total_ms"] / 1000)
            for key, ms in json.loads(row["stage_ms"]).items():
                into[key].append(ms / 1000)
        return {phase: {key: _pct(values, 0.5) for key, values in sorted(keys.items())}
                for phase, keys in spans.items()}

    async def overshoot(self) -> dict[str, Any] | None:
        """A's spend past its daily budget, from the request log, once every answer's
        row is written (the workers have stopped)."""
        if self.policy is None or self.policy.budget_day is None:
            return None
        day = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        conn = await asyncpg.connect(asyncpg_dsn(self.pg.url))
        try:
            read = await budget_overshoot(
                conn, FLOOD, budget=self.policy.budget_day, prices=price_table(self.policy),
                since=day, until=day + timedelta(days=1))
        finally:
            await conn.close()
        return {key: round(value, 6) if isinstance(value, float) else value
                for key, value in read.items()}

    def report(self, overshoot: dict[str, Any] | None) -> dict[str, Any]:
        latency: dict[str, list[float]] = defaultdict(list)
        for rid, (_, sent_at) in self.sent.items():
            first = self.finals.first.get(rid)
            if first is not None:
                latency[self.phase[rid]].append(first[0] - sent_at)
        p95, quiet = _pct(latency["during"], 0.95), _pct(latency["quiet"], 0.95)
        flood = self.floods["flood"]["agents"][FLOOD]
        return {
            "victim_p50_ms": _pct(latency["during"], 0.5),
            "victim_p95_ms": p95,
            "victim_quiet_p95_ms": quiet,
            "victim_over_quiet_p95": _over(p95, quiet),
            "victims_sent": {phase: len(v) for phase, v in latency.items()},
            "flood_sent": flood["sent"],
            "flood_answered": flood["answered"],
            "flood_refused": flood["refused"],
            "flood_s": round(self.floods["flood"]["seconds"], 1),
            # Every request's, the floods' included (counted in their process).
            "lost": sum(1 for rid in self.sent if rid not in self.finals.first)
            + sum(one["lost"] for result in self.floods.values()
                  for one in result["agents"].values()),
            "duplicate_finals": sum(1 for rid in self.sent
                                    if len(self.finals.distinct.get(rid, ())) > 1)
            + sum(one["duplicate_finals"] for result in self.floods.values()
                  for one in result["agents"].values()),
            "budget_overshoot": overshoot,
            "settings": {k: v for k, v in self.extra_env.items()},
        }


def run(flood: int = 5000, quiet: float = 8.0, deadline: float = 300.0,
        env: dict[str, str] | None = None, budget_day: float | None = BUDGET_DAY,
        injector: int = 2000, flooders: int = 5, flooder_requests: int = 1000,
        ask_every: float = 1.0) -> dict[str, Any]:
    """See the module doc; `env` adds worker settings (GATEWAY_PIPELINE_BACKLOG, ...),
    `budget_day` is A's daily budget (None: none), `injector` D's messages (0: none),
    `flooders` the five-flooder phase's agents (0: none), each publishing
    `flooder_requests`; B and C each ask every `ask_every` seconds."""
    from services.retriever.indexing.embedded_ingest import ingest
    from shared.encoders.embeddings import SentenceTransformerEncoder

    with tempfile.TemporaryDirectory(prefix="ir-fairness-") as tmp:
        state = Path(tmp)
        ingest(Path(__file__).resolve().parents[2] / "kb" / "avap", state / "index",
               SentenceTransformerEncoder(), progress=False)
        bench = Fairness(state, flood=flood, quiet=quiet, deadline=deadline, env=env or {},
                         budget_day=budget_day, injector=injector, flooders=flooders,
                         flooder_requests=flooder_requests, ask_every=ask_every)
        bench.nats.start()
        bench.pg.start()
        try:
            migrate(bench.pg.url)
            return asyncio.run(bench.run())
        finally:
            bench.nats.stop()
            bench.pg.stop()


if __name__ == "__main__":
    print(json.dumps(run()))
