"""Chaos benchmark: steady load through 2 replicas of every worker type while replicas
are killed, nats-server and Postgres restart (and, with a 3-node cluster, a NATS node
dies); counts what the promise "every request ends in exactly one final chunk, no
committed turn is lost" survived.

Loopback only, bounded: a fixed number of requests at a fixed rate, a fixed schedule of
faults, a deadline; everything it started is stopped and its state removed.

Keys: sent, answered_once, lost (no final chunk within the deadline), duplicate_finals,
error_finals (by code), failover_s_p50 / failover_s_p99 (kill -> answer, for the
requests in flight at each kill), stall_s (per server restart: server back -> first
answer after it; `nats_node`, with a cluster: node killed -> first answer to a request
published after the kill), history_rows_missing / history_rows_doubled (ok answers whose
classify_history row is missing / there twice), log_rows_missing (final chunks without
a request-log row).
`sigint_process_group` (single server only): `intentroute up` under load gets SIGINT on its
whole process group, as from a terminal, and a second `up` answers what it left
(bench/sigint.py: sent, answered_once, answered_before_exit, lost, duplicate_finals,
drain_s, stall_s, servers_stopped_last, tracebacks).

With `nats_cluster=3` NATS is a three-node cluster (every stream and consumer with 3
replicas, workers and caller given every node's URL): first the node leading the
pipeline stream is killed with SIGKILL (`nats_node_failover`: which node, the time
until every stream and consumer has a new leader, until answers resume, and, once it
is restarted, until it is a current replica of all of them again), then the worker
kills, the restart of the whole cluster (`stall_s.nats`) and of Postgres as without.

`sigstop_replicas`: after the kills, one classifier and one main generator replica are
stopped with SIGSTOP for three ack waits (their buffered deliveries redelivered to the
other replica meanwhile) and resumed: which, how long, requests sent from 2 s before the
stop to the resume, and of those the duplicate finals and lost (both must be 0).

`nats_restart_by_up` (single server): nats-server killed with SIGKILL and started again
by the keeper `intentroute up` runs (intentroute.stack.keeper: same port, data and
configuration): seconds from the kill to the server listening again, from listening to
the caller's own reconnect, and to the first answer after it (target: 2 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import nats
from nats.aio.msg import Msg

from intentroute.stack import DEFAULT_SYNC_INTERVAL, NatsCluster, NatsServer, PostgresServer
from intentroute.stack.keeper import ServerKeeper
from intentroute.stack.nats_users import admin_kwargs, auth_files, service_env, sync_agents
from intentroute.stack.replication import Replicated, leaders, wait_until
from intentroute.supervisor import Supervisor
from intentroute.workers import STAGES, wait_for_consumers
from shared.client.caller import publish_until_stored
from shared.common.settings import nats_servers
from shared.contracts import deadletter, pipeline, request, response
from shared.contracts.codec import decode_chunk
from shared.contracts.request import AgentRequest
from shared.contracts.response import agent_responses
from shared.runtime.consumer import agent_consumer_name
from shared.runtime.streams import ensure_streams
from shared.store import asyncpg_dsn, migrate
from shared.store.agents import AgentStore

AGENT = "chaos"
MIX: list[dict[str, str | None]] = [
    {"query": "What does addParam do?", "query_type": "RETRIEVAL"},
    {"query": "how many calls do I have left?", "extra_context": "calls_used=10"},
    {"query": "en menos palabras", "query_type": "CONVERSATIONAL"},
    {"query": "endpoint that returns the user id", "query_type": "CODE_GENERATION"},
]
REPLICAS = 2
STREAMS = [Replicated(name) for name in (request.STREAM, pipeline.STREAM, response.STREAM,
                                         deadletter.STREAM)]
# The gateway reads the chaos agent's requests through that agent's own consumer.
CONSUMERS = [Replicated(request.STREAM, agent_consumer_name(name, AGENT)) if name == "gateway"
             else Replicated(pipeline.STREAM, name) for name in STAGES]


# STAGE_ACK_WAIT's default, which the workers here run with; a replica is stopped for
# three of them.
ACK_WAIT = 2.0


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


class Tally:
    """Final chunks as the caller sees them live, per request id. A final re-sent as it
    was (its ack lost in a leader election, shared.runtime.answer_stream.AnswerStream) is
    the same message again: counted in `resent`, not as a second answer."""

    def __init__(self) -> None:
        self.finals: dict[str, list[tuple[float, str]]] = defaultdict(list)
        self.seen: dict[str, set[bytes]] = defaultdict(set)
        # What each distinct final said (seq, who answered, error, text's start).
        self.said: dict[str, list[str]] = defaultdict(list)
        self.resent = 0

    async def on_chunk(self, msg: Msg) -> None:
        chunk = decode_chunk(msg.data)
        if chunk.is_final:
            if msg.data in self.seen[chunk.request_id]:
                self.resent += 1
                return
            self.seen[chunk.request_id].add(msg.data)
            code = chunk.error.code if chunk.error else ""
            self.finals[chunk.request_id].append((time.monotonic(), code))
            self.said[chunk.request_id].append(
                f"seq {chunk.seq} {chunk.answered_by or '-'} {code or 'ok'} "
                f"{chunk.text[:30]!r} {msg.subject.rsplit('.', 1)[-1][:8]}")


class Chaos:
    def __init__(self, state: Path, requests: int, rate: float, deadline: float, *,
                 nats_cluster: int = 1, sync_interval: str = DEFAULT_SYNC_INTERVAL) -> None:
        self.state = state
        self.requests = requests
        self.rate = rate
        self.deadline = deadline
        creds = auth_files(state).creds_dir
        self.nats: NatsServer | NatsCluster = (
            NatsCluster(state / "nats", nats_cluster, creds_dir=creds,
                        sync_interval=sync_interval)
            if nats_cluster > 1 else
            NatsServer(state / "nats", creds_dir=creds, sync_interval=sync_interval))
        self.replicas = min(nats_cluster, 3)
        self.servers = nats_servers(self.nats.url)
        self.pg = PostgresServer(state / "postgres")
        self.supervisor = Supervisor()
        self.tally = Tally()
        self.sent: dict[str, float] = {}
        self.kills: list[float] = []
        self.stalls: dict[str, float] = {}
        self.node_failover: dict[str, Any] = {}
        self.restart_by_up: dict[str, float] = {}
        # SIGSTOPped replicas: (names, stopped at, resumed at).
        self.stops: tuple[list[str], float, float] | None = None
        self.caller_reconnects: list[float] = []
        self.publishes: set[asyncio.Task[None]] = set()
        self.t0 = 0.0

    def start_servers(self) -> None:
        self.nats.start()
        self.pg.start()
        migrate(self.pg.url)

    async def prepare(self) -> Any:
        store = await AgentStore.connect(self.pg.url)
        try:
            cred = await store.add(AGENT, trusted=True)
        finally:
            await store.close()
        await sync_agents(self.state, self.pg.url)  # every node reloads
        async with await self.admin() as admin:
            await ensure_streams(admin.jetstream(), 3600, self.replicas)
        return cred

    async def admin(self) -> Any:
        return await nats.connect(self.servers, **admin_kwargs(self.state),
                                  reconnect_time_wait=0.1, max_reconnect_attempts=-1)

    def start_workers(self) -> None:
        env = dict(os.environ, NATS_URL=self.nats.url, DATABASE_URL=self.pg.url,
                   NATS_STREAM_REPLICAS=str(self.replicas),
                   INTENTROUTE_HOME=str(self.state), INDEX_DIR=str(self.state / "index"),
                   RETRIEVER_METHOD="bm25", CLASSIFIER_HEADS_DIR="", GENERATOR_BACKEND="echo",
                   GENERATOR_ECHO_DELAY="0.4", AVAP_PARSER_TIMEOUT="0", LOG_LEVEL="ERROR",
                   REQUEST_DEADLINE=str(self.deadline))
        for name in STAGES:
            for _ in range(REPLICAS):
                self.supervisor.add(name, [sys.executable, "-m", "intentroute.cli", "worker",
                                           name], {**env, **service_env(self.state, name)})

    async def supervise(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.supervisor.poll()
            await asyncio.sleep(0.05)

    async def load(self, nc: Any) -> None:
        self.t0 = time.monotonic()
        for i in range(self.requests):
            sample = MIX[i % len(MIX)]
            req = AgentRequest(
                request_id=uuid.uuid4().hex, session_id=f"chaos-{i % 40}", agent_id=AGENT,
                query=str(sample["query"]), query_type=sample.get("query_type"),
                extra_context=str(sample.get("extra_context") or ""))
            self.sent[req.request_id] = time.monotonic()
            # Published in the background, so the pace holds while a publish waits out
            # a restart or a leader election.
            task = asyncio.create_task(self.publish(nc, req))
            self.publishes.add(task)
            task.add_done_callback(self.publishes.discard)
            await asyncio.sleep(1 / self.rate)
        if self.publishes:
            await asyncio.wait(set(self.publishes))

    async def publish(self, nc: Any, req: AgentRequest) -> None:
        """As a caller does: publish again (the same msg id: never twice in the stream)
        until the stream has it or the request's deadline has passed (then it is lost)."""
        with contextlib.suppress(Exception):  # still not stored: counted as lost
            await publish_until_stored(nc, req, give_up_at=time.monotonic() + self.deadline,
                                       pause=0.25)

    def kill_one(self, name: str) -> None:
        pids = self.supervisor.pids(name)
        if pids:
            os.kill(pids[0], signal.SIGKILL)
            self.kills.append(time.monotonic())

    async def restart_server(self, name: str, stop: Any, start: Any, down: float) -> None:
        await asyncio.to_thread(stop)
        await asyncio.sleep(down)
        await asyncio.to_thread(start)
        back = time.monotonic()
        # The stall: from the server being back to the first answer after it.
        while time.monotonic() - back < 30:
            if any(t > back for finals in list(self.tally.finals.values()) for t, _ in finals):
                self.stalls[name] = round(
                    min(t for finals in self.tally.finals.values() for t, _ in finals
                        if t > back) - back, 3)
                return
            await asyncio.sleep(0.05)
        self.stalls[name] = 30.0

    def first_answer_sent_after(self, moment: float) -> float | None:
        """When the first request published after `moment` was answered."""
        times = [finals[0][0] for rid, finals in list(self.tally.finals.items())
                 if finals and self.sent.get(rid, 0.0) > moment]
        return min(times) if times else None

    async def kill_node(self) -> None:
        """SIGKILL the node leading the pipeline stream; time the new leaders, the first
        answer to a request published after the kill, and, restarted, its catch-up."""
        assert isinstance(self.nats, NatsCluster)
        items = STREAMS + CONSUMERS
        async with await self.admin() as admin:
            js = admin.jetstream()
            led = await leaders(js, items)
            victim = led[str(Replicated(pipeline.STREAM))]
            node = self.nats.node(victim)
            await asyncio.to_thread(node.kill)
            killed = time.monotonic()
            election = await wait_until(js, items, victim, caught_up=False, timeout=60)
            while self.first_answer_sent_after(killed) is None:
                if time.monotonic() - killed > 60:
                    break
                await asyncio.sleep(0.05)
            answered = self.first_answer_sent_after(killed)
            resumed = round(answered - killed, 3) if answered is not None else 60.0
            self.stalls["nats_node"] = resumed
            await asyncio.sleep(1.0)
            await asyncio.to_thread(node.start)
            restarted = time.monotonic()
            caught_up = await wait_until(js, items, victim, caught_up=True, timeout=60)
        self.node_failover = {
            "node": victim,
            "at": round(killed - self.t0, 2),
            "led": sorted(k for k, v in led.items() if v == victim),
            "leader_election_s": round(election, 3),
            "answers_resumed_s": resumed,
            "restarted_after_s": round(restarted - killed, 3),
            "caught_up_s": round(caught_up, 3),
        }

    async def kill_nats_for_up(self) -> None:
        """SIGKILL the nats-server; `up`'s keeper starts it again on the same port. The
        stall is counted from the moment it listens again (the keeper's start returns
        once it accepts connections and wrote its pid file)."""
        assert isinstance(self.nats, NatsServer)
        assert self.nats.proc is not None
        keeper = ServerKeeper([("nats-server", self.nats)])
        self.nats.proc.kill()
        killed = time.monotonic()
        while True:  # as `up` polls it (the keeper's first delay is 0.2 s)
            if await asyncio.to_thread(keeper.poll):
                break
            await asyncio.sleep(0.05)
        back = keeper.kept[0].listening_at
        answered = None
        while answered is None and time.monotonic() - back < 30:
            await asyncio.sleep(0.02)
            answered = self.first_answer_after(back)
        reconnected = min((t for t in self.caller_reconnects if t > killed), default=None)
        self.restart_by_up = {
            "killed_to_listening_s": round(back - killed, 3),
            "listening_to_caller_reconnected_s": (
                round(reconnected - back, 3) if reconnected is not None else 30.0),
            "listening_to_first_answer_s": round(answered - back, 3) if answered else 30.0,
        }

    def first_answer_after(self, moment: float) -> float | None:
        """When the first final chunk after `moment` arrived (any request's)."""
        times = [t for finals in list(self.tally.finals.values()) for t, _ in finals
                 if t > moment]
        return min(times) if times else None

    async def stop_replicas(self, names: tuple[str, ...], seconds: float) -> None:
        """SIGSTOP one replica of each of `names` (its buffered deliveries wait in it),
        SIGCONT it after `seconds` (longer than the ack wait: they were redelivered)."""
        pids = {name: self.supervisor.pids(name)[:1] for name in names}
        stopped = [name for name, found in pids.items() if found]
        for name in stopped:
            os.kill(pids[name][0], signal.SIGSTOP)
        start = time.monotonic()
        try:
            await asyncio.sleep(seconds)
        finally:
            for name in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pids[name][0], signal.SIGCONT)
        self.stops = (stopped, start, time.monotonic())

    def stop_report(self, duplicates: list[str], answered: set[str]) -> dict[str, Any]:
        names, start, end = self.stops or ([], 0.0, 0.0)
        during = [rid for rid, at in self.sent.items() if start - 2.0 <= at <= end]
        return {"stopped": names, "seconds": round(end - start, 2),
                "sent_around": len(during),
                "duplicate_finals": sum(1 for rid in during if rid in duplicates),
                "lost": sum(1 for rid in during if rid not in answered)}

    async def faults(self) -> None:
        await asyncio.sleep(2.0)
        if isinstance(self.nats, NatsCluster):
            await self.kill_node()
        for name in STAGES:
            self.kill_one(name)
            await asyncio.sleep(1.5)
        # Hung replicas (issue 20): stopped for three ack waits with deliveries in hand.
        await self.stop_replicas(("classifier", "generator-main"), 3 * ACK_WAIT)
        await self.restart_server("nats", self.nats.stop, self.nats.start, 1.0)
        await asyncio.sleep(2.0)
        await self.restart_server("postgres", self.pg.stop, self.pg.start, 2.0)
        if isinstance(self.nats, NatsServer):
            await asyncio.sleep(2.0)
            await self.kill_nats_for_up()

    async def stored_finals(self) -> dict[str, int]:
        """Final chunks per request as the response stream stored them."""
        from bench.sigint import count_stored_finals

        async with await self.admin() as admin:
            return dict(await count_stored_finals(admin, AGENT, "chaos-count"))

    async def rows(self) -> tuple[Counter[str], set[str]]:
        import asyncpg

        conn = await asyncpg.connect(asyncpg_dsn(self.pg.url))
        try:
            history = Counter(r["request_id"] for r in await conn.fetch(
                "SELECT request_id FROM classify_history WHERE agent_id = $1", AGENT))
            logged = {r["request_id"] for r in await conn.fetch(
                "SELECT request_id FROM request_log WHERE agent_id = $1", AGENT)}
        finally:
            await conn.close()
        return history, logged

    async def run(self) -> dict[str, Any]:
        cred = await self.prepare()
        self.start_workers()
        stop = asyncio.Event()
        supervising = asyncio.create_task(self.supervise(stop))
        try:
            async with await self.admin() as admin:
                await wait_for_consumers(admin, list(STAGES))
            async def reconnected() -> None:
                self.caller_reconnects.append(time.monotonic())

            nc = await nats.connect(self.servers, **cred.nats, reconnect_time_wait=0.1,
                                    max_reconnect_attempts=-1, reconnected_cb=reconnected)
            await nc.subscribe(agent_responses(AGENT), cb=self.tally.on_chunk)
            await asyncio.gather(self.load(nc), self.faults())
            # Everything ends within the deadline (a request published last, plus it).
            for _ in range(int((self.deadline + 5) / 0.25)):
                if all(rid in self.tally.finals for rid in self.sent):
                    break
                await asyncio.sleep(0.25)
            await asyncio.sleep(1.0)  # late duplicates would arrive now
            await nc.drain()
            stored = await self.stored_finals()
            history, logged = await self.rows()
        finally:
            stop.set()
            await supervising
            self.supervisor.stop(timeout=15)
        return self.report(stored, history, logged)

    def report(self, stored: dict[str, int], history: Counter[str], logged: set[str]
               ) -> dict[str, Any]:
        live = self.tally.finals
        answered = {rid for rid in self.sent if live.get(rid) or stored.get(rid)}
        duplicates = [rid for rid in self.sent
                      if max(len(live.get(rid, [])), stored.get(rid, 0)) > 1]
        errors: Counter[str] = Counter(
            code for rid in self.sent for _, code in live.get(rid, [])[:1] if code)
        ok = {rid for rid in answered if not any(code for _, code in live.get(rid, []))}
        failovers = []
        # A request answered after the replicas were stopped waited for the stop too:
        # it measures `sigstop_replicas`, not the kill's failover.
        stopped_at = self.stops[1] if self.stops else float("inf")
        for kill in self.kills:
            for rid, sent_at in self.sent.items():
                finals = live.get(rid, [])
                if sent_at < kill and finals and kill < finals[0][0] < stopped_at:
                    failovers.append(finals[0][0] - kill)
        return {
            "sent": len(self.sent),
            "answered_once": sum(1 for rid in answered if rid not in duplicates),
            "lost": len(self.sent) - len(answered),
            "duplicate_finals": len(duplicates),
            "error_finals": dict(errors),
            "failover_s_p50": _pct(failovers, 0.5),
            "failover_s_p99": _pct(failovers, 0.99),
            "stall_s": self.stalls,
            "history_rows_missing": sum(1 for rid in ok if history[rid] == 0),
            "history_rows_doubled": sum(1 for rid in ok if history[rid] > 1),
            "log_rows_missing": sum(1 for rid in answered if rid not in logged),
            "kills": len(self.kills),
            # Identical copies of a final whose ack was lost (not second answers).
            "resent_finals": self.tally.resent,
            # Why a promise broke, when it did: each duplicate's finals (seconds after the
            # first request) and the faults' times.
            "duplicates_detail": [
                {"request_id": rid, "finals": [round(t - self.t0, 2) for t, _ in live[rid]],
                 "stored": stored.get(rid, 0), "sent": round(self.sent[rid] - self.t0, 2),
                 "said": self.tally.said[rid]}
                for rid in duplicates[:10]],
            "faults_at": [round(t - self.t0, 2) for t in self.kills],
            **({"nats_node_failover": self.node_failover} if self.node_failover else {}),
            **({"nats_restart_by_up": self.restart_by_up} if self.restart_by_up else {}),
            **({"sigstop_replicas": self.stop_report(duplicates, answered)}
               if self.stops else {}),
        }


def run(requests: int = 1000, rate: float = 40.0, deadline: float = 60.0, *,
        nats_cluster: int = 1, sync_interval: str = DEFAULT_SYNC_INTERVAL) -> dict[str, Any]:
    """`requests` at `rate` per second through the chaos; see the module doc."""
    from services.retriever.indexing.embedded_ingest import ingest
    from shared.encoders.embeddings import SentenceTransformerEncoder

    with tempfile.TemporaryDirectory(prefix="ir-chaos-") as tmp:
        state = Path(tmp)
        ingest(Path(__file__).resolve().parents[2] / "kb" / "avap", state / "index",
               SentenceTransformerEncoder(), progress=False)
        chaos = Chaos(state, requests, rate, deadline, nats_cluster=nats_cluster,
                      sync_interval=sync_interval)
        chaos.start_servers()
        try:
            result = asyncio.run(chaos.run())
        finally:
            chaos.nats.stop()
            chaos.pg.stop()
        if nats_cluster == 1:
            # Ctrl-C to `intentroute up`'s process group under load, on an `up` of its own.
            from bench.sigint import sigint_under_load

            result["sigint_process_group"] = asyncio.run(sigint_under_load(
                state / "sigint" / "home", state / "index", requests=300))
        # Postgres paused 20 s under returning sessions' questions, which read their
        # history and previous answer (bench/pg_pause.py; issue 32).
        from bench.pg_pause import pause_under_load

        result["postgres_pause_20s"] = pause_under_load(state / "pg-pause", state / "index")
        return result


if __name__ == "__main__":
    import json

    print(json.dumps(run()))
