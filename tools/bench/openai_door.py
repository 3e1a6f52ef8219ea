"""`bench pipeline --door openai`: the OpenAI-compatible door against the NATS door,
in the same run on the same workers.

Sequential requests go through the NATS door (`shared.client.caller.ask`), the OpenAI
door collected (`stream: false`) and streamed (`stream: true`, read to `[DONE]`), in
turn, one at a time; then `load` requests through the OpenAI door, `window` at once
(the NATS door's throughput is the pipeline bench's own figure, the same run).

A door's own time is measured per request: an admin connection watches the request
appear on `agent.request.<agent>` and the final chunk on its response subject, so
`door_ms` = (request on the bus - caller sent it) + (caller has the whole answer -
final chunk on the bus): everything but the pipeline. The watcher's own delivery delay
is in the first term and out of the second, so it cancels. `door_overhead_ms_p50` is
the OpenAI door's median time (collected answers) above the NATS door's, as its caller
sees it: the door's work, the HTTP client's, and the loopback hop to one more process
and back. `door_own_ms_p50` is the door's work alone, as the doors measure it
(`Server-Timing: door`): from its handler's start to the request handed to the bus, and
from the final chunk to the response.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from bench.pipeline import MIX
from shared.client.caller import ask
from shared.contracts.codec import decode_chunk
from shared.contracts.request import AgentRequest

# HTTP-only agents: the door publishes for them, they hold no NATS user.
SEQ_AGENT, LOAD_AGENT = "bench-openai", "bench-openai-load"
NATS_AGENT = "bench-seq"
_request_id = msgspec.json.Decoder(dict[str, Any])


class Tap:
    """When each request and each final chunk was seen on the bus (perf_counter)."""

    def __init__(self) -> None:
        self.requested: dict[str, float] = {}
        self.finished: dict[str, float] = {}

    async def on_request(self, msg: Msg) -> None:
        seen = time.perf_counter()
        rid = _request_id.decode(msg.data).get("request_id", "")
        self.requested.setdefault(rid, seen)

    async def on_response(self, msg: Msg) -> None:
        seen = time.perf_counter()
        chunk = decode_chunk(msg.data)
        if chunk.is_final:
            self.finished.setdefault(chunk.request_id, seen)

    async def door_ms(self, rid: str, sent: float, done: float) -> tuple[float, float]:
        """(in: sent -> on the bus, out: final on the bus -> the caller has it), ms."""
        # The watcher's copy of the final chunk may come after the caller's.
        for _ in range(1000):
            if rid in self.requested and rid in self.finished:
                break
            await asyncio.sleep(0.001)
        return ((self.requested[rid] - sent) * 1000, (done - self.finished[rid]) * 1000)


class WorkerCpu:
    """CPU seconds a worker (a child of this process: the gateway, the doors) has used,
    from /proc: a door's CPU cost per request, which the machine's load does not inflate
    as it does wall time (the figure to hold to the target on a shared machine)."""

    def __init__(self, worker: str) -> None:
        self.path = ""
        for stat in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                cmdline = stat.read_bytes()
                parent = int((stat.parent / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if parent == os.getpid() and cmdline.endswith(f"worker\x00{worker}\x00".encode()):
                self.path = str(stat.parent / "stat")
        self.tick = os.sysconf("SC_CLK_TCK")

    def seconds(self) -> float:
        if not self.path:
            return 0.0
        fields = Path(self.path).read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.tick


def _sample(i: int) -> tuple[str, dict[str, Any]]:
    """The request id and the OpenAI body of the mix's i-th request."""
    sample = MIX[i % len(MIX)]
    rid = uuid.uuid4().hex
    messages = [{"role": "user", "content": sample["query"]}]
    if sample.get("extra_context"):
        messages.insert(0, {"role": "system", "content": sample["extra_context"]})
    model = f"intentroute/{sample['query_type']}" if sample.get("query_type") else "intentroute"
    return rid, {"model": model, "messages": messages,
                 "intentroute": {"request_id": rid, "session_id": f"bench-oai-{i % 50}"}}


def _nats_request(i: int) -> AgentRequest:
    sample = MIX[i % len(MIX)]
    return AgentRequest(request_id=uuid.uuid4().hex, session_id=f"bench-{i % 50}",
                        agent_id=NATS_AGENT, query=str(sample["query"]),
                        query_type=sample.get("query_type"),
                        extra_context=str(sample.get("extra_context") or ""))


async def _post(http: aiohttp.ClientSession, url: str, token: str, body: dict[str, Any],
                *, stream: bool = False) -> tuple[float, float]:
    """Send one chat completion: (perf_counter when the whole answer is in, the door's
    own ms from its `Server-Timing`)."""
    async with http.post(url, json={**body, "stream": stream},
                         headers={"Authorization": f"Bearer {token}"}) as resp:
        data = await resp.read()
        done = time.perf_counter()
    if resp.status != 200 or (stream and not data.endswith(b"data: [DONE]\n\n")):
        raise RuntimeError(f"OpenAI door answered {resp.status}: {data[:300]!r}")
    return done, server_timing(resp.headers.get("Server-Timing", ""), "door")


def server_timing(header: str, name: str) -> float:
    """The `dur` of metric `name` in a `Server-Timing` header (ms), NaN when absent."""
    for metric in header.split(","):
        parts = [p.strip() for p in metric.split(";")]
        if parts[0] == name:
            for param in parts[1:]:
                key, _, value = param.partition("=")
                if key == "dur":
                    return float(value)
    return float("nan")


async def _add_agents(db_url: str) -> dict[str, str]:
    """The door's callers (trusted: the mix declares types): agent id -> token."""
    from shared.store.agents import AgentStore

    store = await AgentStore.connect(db_url)
    try:
        return {agent: (await store.add(agent, trusted=True)).token
                for agent in (SEQ_AGENT, LOAD_AGENT)}
    finally:
        await store.close()


def _p(values: list[float], q: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


def _figures(e2e: list[float], door: list[tuple[float, float]]) -> dict[str, float]:
    return {"e2e_ms_p50": _p(e2e, 0.5), "e2e_ms_p99": _p(e2e, 0.99),
            "door_ms_p50": round(statistics.median(i + o for i, o in door), 3),
            "door_in_ms_p50": round(statistics.median(i for i, _ in door), 3),
            "door_out_ms_p50": round(statistics.median(o for _, o in door), 3)}


async def _sequential(nc: Client, http: aiohttp.ClientSession, url: str, token: str,
                      tap: Tap, requests: int) -> dict[str, dict[str, float]]:
    e2e: dict[str, list[float]] = {"nats": [], "openai": [], "openai_stream": []}
    own: list[float] = []  # the OpenAI door's own ms, collected answers
    door: dict[str, list[tuple[float, float]]] = {name: [] for name in e2e}
    # CPU of the gateway (admission) and of the doors (the OpenAI door's own process).
    cpu = {name: {"gateway": 0.0, "doors": 0.0} for name in e2e}
    procs = {worker: WorkerCpu(worker) for worker in ("gateway", "doors")}

    def used() -> dict[str, float]:
        return {worker: proc.seconds() for worker, proc in procs.items()}

    def spent(name: str, before: dict[str, float]) -> None:
        for worker, seconds in used().items():
            cpu[name][worker] += seconds - before[worker]

    for i in range(requests):
        req = _nats_request(i)
        before = used()
        sent = time.perf_counter()
        async for _ in ask(nc, req, timeout=60):
            pass
        done = time.perf_counter()
        e2e["nats"].append((done - sent) * 1000)
        door["nats"].append(await tap.door_ms(req.request_id, sent, done))
        spent("nats", before)
        for name in ("openai", "openai_stream"):
            rid, body = _sample(i)
            before = used()
            sent = time.perf_counter()
            done, door_own = await _post(http, url, token, body,
                                         stream=name == "openai_stream")
            if name == "openai":
                own.append(door_own)
            e2e[name].append((done - sent) * 1000)
            door[name].append(await tap.door_ms(rid, sent, done))
            spent(name, before)
    figures = {name: {**_figures(e2e[name], door[name]),
                      "gateway_cpu_ms_mean": round(cpu[name]["gateway"] / requests * 1000, 3),
                      "doors_cpu_ms_mean": round(cpu[name]["doors"] / requests * 1000, 3)}
               for name in e2e}
    figures["openai"]["door_own_ms_p50"] = round(statistics.median(own), 3)
    return figures


async def _throughput(http: aiohttp.ClientSession, url: str, token: str, load: int,
                      window: int) -> float:
    sem = asyncio.Semaphore(window)

    async def one(i: int) -> None:
        async with sem:
            await _post(http, url, token, _sample(i)[1])

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(load)))
    return round(load / (time.perf_counter() - started), 1)


async def measure_doors(servers: list[str], creds: dict[str, dict[str, Any]], db_url: str,
                        http_url: str, *, requests: int, load: int, window: int
                        ) -> dict[str, Any]:
    tokens = await _add_agents(db_url)
    url = f"{http_url}/v1/chat/completions"
    admin = await nats.connect(servers, **creds["admin"])
    nc = await nats.connect(servers, **creds[NATS_AGENT])
    tap = Tap()
    watching = [await admin.subscribe("agent.request.>", cb=tap.on_request),
                await admin.subscribe("agent.response.>", cb=tap.on_response)]
    await admin.flush()
    connector = aiohttp.TCPConnector(limit=window)
    try:
        async with aiohttp.ClientSession(connector=connector) as http:
            for i in range(20):  # warm-up: the door's agent cache, its consumer
                await _post(http, url, tokens[SEQ_AGENT], _sample(i)[1])
                await _post(http, url, tokens[LOAD_AGENT], _sample(i)[1])
            doors = await _sequential(nc, http, url, tokens[SEQ_AGENT], tap, requests)
            for sub in watching:
                await sub.unsubscribe()
            doors["openai"]["throughput_rps"] = await _throughput(
                http, url, tokens[LOAD_AGENT], load, window)
    finally:
        await nc.drain()
        await admin.drain()
    overhead = doors["openai"]["door_ms_p50"] - doors["nats"]["door_ms_p50"]
    # What a request through the OpenAI door costs the gateway and the doors beyond one
    # through NATS (which the doors never see).
    cpu = sum(doors["openai"][f"{w}_cpu_ms_mean"] - doors["nats"][f"{w}_cpu_ms_mean"]
              for w in ("gateway", "doors"))
    return {"doors": doors, "door_overhead_ms_p50": round(overhead, 3),
            "door_own_ms_p50": doors["openai"]["door_own_ms_p50"],
            "door_cpu_ms_mean": round(cpu, 3), "door_overhead_target_ms": 1.0}
