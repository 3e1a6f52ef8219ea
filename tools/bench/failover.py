"""Failover benchmark: every way a model server fails, through a real stack.

Loopback, authentication on (as `intentroute up`): embedded nats-server and Postgres,
the gateway, the classifier and two generator replicas (conversational slot) as their
own processes, a fleet file (LLM_FLEET) whose backends are the fault-injecting provider
(testkit.fault_provider) run by this process. Each fault is its own backend `x-<fault>`
(its circuit its own) serving the model of that name; `good` serves `ok` (and continues
a cut answer when `fallback_prefill`, else restarts it).

For each fault, `requests` CONVERSATIONAL requests (at most `concurrency` at once) name
the fault's model as their first step (`AgentRequest.model`, which the agent's policy
lists), so each walks the chain `x-<fault>/<fault>, good/ok, extractive`; for
`prefill-reject`, a cut answer whose next model refuses the prefill:
`x-prefill-cut/cut-40, x-prefill-reject/prefill-reject, good/ok, extractive`. The agent's
latency targets: `ttft_ms`, `stall_ms` (its policy); the first byte within
FIRST_BYTE_MS (the workers' setting); circuits as shipped (3 failures, 5 s cooldown).

Per fault (`faults`): `rescued` (a final without error whose text, the reset marker
honoured, is the provider's whole answer: it is known, 60 words), `extractive` (the
extractive answerer's answer), `clean_error` (a typed error final), `truncated_success`
(a final without error whose text is not a whole answer: must be 0), `hung` (no final
within `deadline`: must be 0), `attempts_on_failing_model` (the most calls one request
made to the fault's model, told apart by a tag in its query: bounded),
`attempts_total`, `wall_s_p95` (publish to final), `gap_s_max` (the widest wait between
two text chunks of one answer: a stall is handed over within stall_ms + 1 s),
`answered_by` (how many each model answered), `errors` (by code).

`flap`: the provider's `flap` answers 503 for `outage` seconds while requests keep
coming (one every PACE s); `served_during_outage` (a whole answer, of those sent during
it: `sent_during_outage`) and `returned_to_primary_s`: from the provider's recovery to
the first answer by `x-flap/flap` (its circuit, opened by the outage, probed back;
target <= 30; null: not within RETURN_WAIT).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client

from intentroute.stack import embedded_stack, free_port
from intentroute.stack.nats_users import admin_kwargs, service_env, sync_agents
from intentroute.workers import wait_for_consumers
from shared.client.caller import AnswerTimeoutError, ask
from shared.contracts.request import AgentRequest
from shared.contracts.response import ChunkKind, ResponseChunk
from shared.policy.agent import AgentPolicy
from shared.runtime.streams import ensure_streams
from shared.store import asyncpg_dsn, migrate
from shared.store.agents import AgentStore
from shared.store.policies import save_policy
from testkit.fault_provider import EXTRA, FAULTS, FaultProvider, is_complete

GOOD = "good"
GENERATOR = "generator-conversational"
WORKERS = ("gateway", "classifier", GENERATOR, GENERATOR)
MAIN, PREFILL = "fo-main", "fo-prefill"
# The agents' latency targets and the workers' first-byte time (milliseconds); the
# provider's slow first token and its time between two words (seconds).
TTFT_MS, STALL_MS, FIRST_BYTE_MS = 1500, 1000, 1000
SLOW_TTFT_S, TOKEN_S = 3.0, 0.01
# flap: a request every PACE seconds; after the recovery, until the primary answers or
# RETURN_WAIT seconds pass.
PACE, RETURN_WAIT = 0.25, 60.0
BENCH_FAULTS = (*FAULTS, *EXTRA)


def backend_of(fault: str) -> str:
    return f"x-{fault}"


def first_model(fault: str) -> str:
    """The model a request of this fault names as its chain's first."""
    if fault == "prefill-reject":
        return "x-prefill-cut/cut-40"
    return f"{backend_of(fault)}/{fault}"


def fleet_toml(base_url: str, *, fallback_prefill: bool) -> str:
    def backend(name: str, model: str, prefill: bool, context: int) -> str:
        return (f'[backends.{name}]\nkind = "openai"\nurl = "{base_url}"\n'
                f'[backends.{name}.models."{model}"]\n'
                f"prefill = {str(prefill).lower()}\ncontext = {context}\n")

    parts = [backend(backend_of(f), f, True, 4096) for f in BENCH_FAULTS]
    parts.append(backend("x-prefill-cut", "cut-40", True, 4096))
    parts.append(backend(GOOD, "ok", fallback_prefill, 128000))
    parts.append(f'[slots]\nmain = "{GOOD}/ok"\nconversational = "{GOOD}/ok"\n')
    return "\n".join(parts)


def policies() -> dict[str, AgentPolicy]:
    """The agents' chains after the first model, their latency targets, and the fault
    models their requests may name first."""
    models = [first_model(f) for f in BENCH_FAULTS]
    chains = {MAIN: [f"{GOOD}/ok", "extractive"],
              PREFILL: [f"{backend_of('prefill-reject')}/prefill-reject", f"{GOOD}/ok",
                        "extractive"]}
    return {agent: AgentPolicy(fallback={"conversational": chain}, ttft_ms=TTFT_MS,
                               stall_ms=STALL_MS, models=models)
            for agent, chain in chains.items()}


@dataclass
class Outcome:
    """One request as its caller saw it."""

    tag: str
    sent_at: float
    final: ResponseChunk | None = None
    done_at: float = 0.0
    text: str = ""  # the answer, the reset marker honoured
    gap_s: float = 0.0  # the widest wait between two text chunks

    @property
    def kind(self) -> str:
        if self.final is None:
            return "hung"
        if self.final.error is not None:
            return "clean_error"
        if self.final.answered_by == "extractive":
            return "extractive"
        return "rescued" if is_complete(self.text) else "truncated_success"


@dataclass
class Asker:
    connections: dict[str, Client]
    deadline: float
    outcomes: list[Outcome] = field(default_factory=list)

    async def one(self, agent: str, model: str) -> Outcome:
        tag = uuid.uuid4().hex[:12]
        req = AgentRequest(request_id=uuid.uuid4().hex, session_id=f"fo-{tag}",
                           agent_id=agent, query=f"say that again [{tag}]",
                           query_type="CONVERSATIONAL", model=model)
        out = Outcome(tag, time.monotonic())
        self.outcomes.append(out)
        last_text_at = 0.0
        try:
            async for chunk in ask(self.connections[agent], req, timeout=self.deadline):
                now = time.monotonic()
                if chunk.kind == ChunkKind.RESET:
                    out.text = ""
                elif chunk.kind == ChunkKind.TEXT or (chunk.is_final and chunk.error is None):
                    if last_text_at:
                        out.gap_s = max(out.gap_s, now - last_text_at)
                    last_text_at = now
                    out.text += chunk.text
                if chunk.is_final:
                    out.final, out.done_at = chunk, now
        except AnswerTimeoutError:
            pass  # hung: no final within the deadline
        return out


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 3)


def summary(outcomes: list[Outcome], provider: FaultProvider, model: str) -> dict[str, Any]:
    """The figures of a fault's requests (module doc)."""
    kinds = Counter(o.kind for o in outcomes)
    per_request = [sum(1 for c in provider.calls if c.model == model and _tagged(c.body, o.tag))
                   for o in outcomes]
    return {
        "requests": len(outcomes),
        "rescued": kinds["rescued"],
        "extractive": kinds["extractive"],
        "clean_error": kinds["clean_error"],
        "truncated_success": kinds["truncated_success"],
        "hung": kinds["hung"],
        "attempts_on_failing_model": max(per_request, default=0),
        "attempts_total": sum(per_request),
        "wall_s_p95": _p95([o.done_at - o.sent_at for o in outcomes if o.final is not None]),
        "gap_s_max": round(max((o.gap_s for o in outcomes), default=0.0), 3),
        "answered_by": dict(Counter(o.final.answered_by for o in outcomes
                                    if o.final is not None and o.final.error is None)),
        "errors": dict(Counter(o.final.error.code for o in outcomes
                               if o.final is not None and o.final.error is not None)),
    }


def _tagged(body: dict[str, Any], tag: str) -> bool:
    return any(tag in str(m.get("content", "")) for m in body.get("messages") or [])


class Failover:
    def __init__(self, state: Path, *, requests: int, concurrency: int, deadline: float,
                 outage: float, fallback_prefill: bool) -> None:
        self.state = state
        self.requests = requests
        self.concurrency = concurrency
        self.deadline = deadline
        self.outage = outage
        self.fallback_prefill = fallback_prefill
        self.provider = FaultProvider(port=free_port(), slow_ttft_s=SLOW_TTFT_S,
                                      token_delay=TOKEN_S)
        self.fleet = state / "fleet.toml"
        self.fleet.write_text(fleet_toml(self.provider.base_url,
                                         fallback_prefill=fallback_prefill), encoding="utf-8")

    async def prepare(self, nats_url: str, db_url: str) -> dict[str, Any]:
        import asyncpg

        store = await AgentStore.connect(db_url)
        try:  # trusted: their declared CONVERSATIONAL is honoured
            creds = {agent: await store.add(agent, trusted=True) for agent in (MAIN, PREFILL)}
        finally:
            await store.close()
        conn = await asyncpg.connect(asyncpg_dsn(db_url))
        try:
            for agent, policy in policies().items():
                await save_policy(conn, agent, policy)
        finally:
            await conn.close()
        await sync_agents(self.state, db_url)
        async with await nats.connect(nats_url, **admin_kwargs(self.state)) as admin:
            await ensure_streams(admin.jetstream(), 3600)
        return creds

    def start_workers(self, nats_url: str, db_url: str) -> list[subprocess.Popen[bytes]]:
        env = dict(os.environ, NATS_URL=nats_url, DATABASE_URL=db_url,
                   INTENTROUTE_HOME=str(self.state), CLASSIFIER_HEADS_DIR="", LOG_LEVEL="ERROR",
                   REQUEST_DEADLINE=str(self.deadline), LLM_FLEET=str(self.fleet),
                   GENERATOR_BACKEND="openai", LLM_FIRST_BYTE_MS=str(FIRST_BYTE_MS))
        return [subprocess.Popen([sys.executable, "-m", "intentroute.cli", "worker", name],
                                 env={**env, **service_env(self.state, name)})
                for name in WORKERS]

    async def fault(self, asker: Asker, fault: str) -> dict[str, Any]:
        agent = PREFILL if fault == "prefill-reject" else MAIN
        gate = asyncio.Semaphore(self.concurrency)

        async def one() -> Outcome:
            async with gate:
                return await asker.one(agent, first_model(fault))

        outcomes = await asyncio.gather(*(one() for _ in range(self.requests)))
        report = summary(list(outcomes), self.provider, fault)
        report["chain"] = [first_model(fault), *(
            [f"{backend_of(fault)}/prefill-reject"] if fault == "prefill-reject" else []),
            f"{GOOD}/ok", "extractive"]
        return report

    async def flap(self, asker: Asker) -> dict[str, Any]:
        """The `flap` fault: an outage with requests coming, then the way back."""
        primary = first_model("flap")
        during: list[asyncio.Task[Outcome]] = []
        self.provider.go_down(self.outage)
        recovered_at = time.monotonic() + self.outage
        while time.monotonic() < recovered_at:
            during.append(asyncio.create_task(asker.one(MAIN, primary)))
            await asyncio.sleep(PACE)
        after: list[Outcome] = []
        back_at: float | None = None
        while back_at is None and time.monotonic() - recovered_at < RETURN_WAIT:
            out = await asker.one(MAIN, primary)
            after.append(out)
            if out.final is not None and out.final.answered_by == primary:
                back_at = out.done_at
            else:
                await asyncio.sleep(PACE)
        served = list(await asyncio.gather(*during))
        report = summary([*served, *after], self.provider, "flap")
        report.update(
            chain=[primary, f"{GOOD}/ok", "extractive"],
            outage_s=self.outage,
            sent_during_outage=len(served),
            served_during_outage=sum(o.kind == "rescued" for o in served),
            returned_to_primary_s=(round(back_at - recovered_at, 2)
                                   if back_at is not None else None))
        return report

    async def run(self, nats_url: str, db_url: str) -> dict[str, Any]:
        creds = await self.prepare(nats_url, db_url)
        await self.provider.start()
        procs = self.start_workers(nats_url, db_url)
        connections: dict[str, Client] = {}
        try:
            async with await nats.connect(nats_url, **admin_kwargs(self.state)) as admin:
                await wait_for_consumers(admin, list(dict.fromkeys(WORKERS)))
            for agent, cred in creds.items():
                connections[agent] = await nats.connect(nats_url, **cred.nats)
            asker = Asker(connections, self.deadline)
            faults: dict[str, Any] = {}
            for fault in BENCH_FAULTS:
                faults[fault] = (await self.flap(asker) if fault == "flap"
                                 else await self.fault(asker, fault))
        finally:
            for nc in connections.values():
                await nc.close()
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(15)
            await self.provider.stop()
        return {"faults": faults, "settings": {
            "requests": self.requests, "concurrency": self.concurrency,
            "deadline_s": self.deadline, "ttft_ms": TTFT_MS, "stall_ms": STALL_MS,
            "first_byte_ms": FIRST_BYTE_MS, "slow_ttft_s": SLOW_TTFT_S,
            "fallback_prefill": self.fallback_prefill, "generator_replicas": 2}}


def run(requests: int = 20, concurrency: int = 4, deadline: float = 30.0,
        outage: float = 10.0, fallback_prefill: bool = True) -> dict[str, Any]:
    """See the module doc."""
    with tempfile.TemporaryDirectory(prefix="ir-failover-") as tmp:
        state = Path(tmp)
        with embedded_stack(state) as (nats_url, db_url):
            migrate(db_url)
            bench = Failover(state, requests=requests, concurrency=concurrency,
                             deadline=deadline, outage=outage,
                             fallback_prefill=fallback_prefill)
            return asyncio.run(bench.run(nats_url, db_url))


if __name__ == "__main__":
    print(json.dumps(run()))
