"""Two gateway replicas' limit gates on one real Postgres, each admitting on its own
allowance (services/gateway/limits/lease.py): with concurrent requests of one agent
through both, no more is admitted than the per-request check allows, a budget's
overshoot stays within its bound, what an idle replica did not use is given back, and a
flood far from its limits costs a fraction of a statement per request."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from services.gateway.limits.gate import LimitGate
from services.gateway.limits.lease import IDLE_LEASES
from services.gateway.limits.ports import Admission, Ask, Grant, Held, Limits, Verdict
from services.gateway.limits.settings import LimitSettings
from services.gateway.limits.store import PgLimits, budget_overshoot
from shared.contracts.pipeline import Admitted
from shared.contracts.request import AgentRequest
from shared.policy.agent import AgentPolicy, Price
from shared.store import asyncpg_dsn
from testkit.fakes import FakePolicies

pytestmark = pytest.mark.integration

TTL = 0.4  # short allowances: the give-back is seen within a second


class CountedLimits(PgLimits):
    """PgLimits counting its statements."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        super().__init__(pool)
        self.calls = 0

    async def lease(self, agent_id: str, *, replica: str, seq: int, asks: Sequence[Ask],
                    held: Sequence[Held], keep: int, want: int, ttl: float, share: int,
                    limits: Limits, prices: Mapping[str, list[float]], now: float) -> Grant:
        self.calls += 1
        return await super().lease(agent_id, replica=replica, seq=seq, asks=asks, held=held,
                                   keep=keep, want=want, ttl=ttl, share=share, limits=limits,
                                   prices=prices, now=now)


@pytest.fixture
async def replicas(database_url: str) -> AsyncIterator[list[CountedLimits]]:
    """Two replicas' stores, each on its own pool."""
    pools = [await asyncpg.create_pool(asyncpg_dsn(database_url), min_size=1, max_size=4)
             for _ in range(2)]
    yield [CountedLimits(pool) for pool in pools if pool is not None]
    for pool in pools:
        if pool is not None:
            await pool.close()


def gates(stores: list[CountedLimits], agent: str, policy: AgentPolicy) -> list[LimitGate]:
    policies = FakePolicies({agent: policy})
    return [LimitGate(store, policies, LimitSettings(), ttl=TTL) for store in stores]


def envelope(agent: str) -> Admitted:
    now = time.time()
    return Admitted(request=AgentRequest(request_id=uuid.uuid4().hex, session_id="s",
                                         query="q", agent_id=agent),
                    accepted_at=now, deadline=now + 60)


async def flood(gates: list[LimitGate], agent: str, n: int, *, at_once: int = 32
                ) -> list[tuple[Admitted, Admission]]:
    """`n` requests, `at_once` concurrently, taken by the replicas in turn."""
    sem = asyncio.Semaphore(at_once)

    async def one(i: int) -> tuple[Admitted, Admission]:
        async with sem:
            env = envelope(agent)
            admission, _ = await gates[i % len(gates)].check(env)
            return env, admission

    return list(await asyncio.gather(*(one(i) for i in range(n))))


def admitted(results: list[tuple[Admitted, Admission]]) -> int:
    return sum(a.verdict == Verdict.ADMIT for _, a in results)


async def test_two_replicas_admit_no_more_than_the_bucket_and_give_back_what_they_hold(
        replicas: list[CountedLimits]) -> None:
    agent = f"lease-{uuid.uuid4().hex[:8]}"
    # 400 requests and (in practice) no refill: every admission is one token.
    both = gates(replicas, agent, AgentPolicy(rate=1e-6, burst=400))
    first = await flood(both, agent, 1000)
    refused = Counter(a.verdict for _, a in first if a.verdict != Verdict.ADMIT)
    assert admitted(first) <= 400
    assert set(refused) == {Verdict.RATE_LIMITED}
    # Far from the limit, admissions went on allowances: fewer statements than requests.
    assert sum(store.calls for store in replicas) < 1000 / 2
    # Idle past IDLE_LEASES lease periods: whatever a replica held went back.
    await asyncio.sleep((IDLE_LEASES + 2) * TTL)
    second = await flood(both, agent, 100)
    assert admitted(first) + admitted(second) == 400


async def test_two_replicas_share_a_budget_and_overshoot_within_the_bound(
        replicas: list[CountedLimits], database_url: str) -> None:
    agent = f"lease-{uuid.uuid4().hex[:8]}"
    # One cost unit per input token; every answer costs 2. Admitted while spent + reserved
    # < 201: 101 answers, 202 spent, 1 past the budget, within what was reserved.
    prices = {"m": [1000.0, 0.0, 0.0]}
    both = gates(replicas, agent, AgentPolicy(budget_day=201.0,
                                              prices={"m": Price(1000.0, 0.0, 0.0)}))
    log = await asyncpg.create_pool(asyncpg_dsn(database_url), min_size=1, max_size=4)
    assert log is not None
    answering: set[asyncio.Task[None]] = set()

    async def answer(env: Admitted) -> None:
        """The answering stage: its request-log row a little later."""
        await asyncio.sleep(random.uniform(0.002, 0.02))
        await log.execute(
            "INSERT INTO request_log (request_id, agent_id, session_id, outcome, model, "
            "tokens_in, tokens_out, created_at) "
            "VALUES ($1, $2, 's', 'ok', 'm', 2, 0, to_timestamp($3::float8))",
            env.request.request_id, agent, env.accepted_at)

    async def client(i: int, results: list[Verdict]) -> None:
        """Asks until refused past the budget; a probe refusal (cost not known yet)
        is retried."""
        while True:
            env = envelope(agent)
            admission, _ = await both[i % 2].check(env)
            results.append(admission.verdict)
            if admission.verdict == Verdict.ADMIT:
                task = asyncio.create_task(answer(env))
                answering.add(task)
                task.add_done_callback(answering.discard)
            elif admission.verdict == Verdict.BUDGET_EXCEEDED:
                return
            else:
                await asyncio.sleep(0.01)

    try:
        first: list[Verdict] = []
        await asyncio.gather(*(client(i, first) for i in range(16)))
        await asyncio.gather(*answering)
        assert first.count(Verdict.ADMIT) <= 101
        assert set(first) <= {Verdict.ADMIT, Verdict.PROBE, Verdict.BUDGET_EXCEEDED}
        # Allowances given back and every answer settled: the rest of the budget is used.
        await asyncio.sleep((IDLE_LEASES + 2) * TTL)
        second: list[Verdict] = []
        await asyncio.gather(*(client(i, second) for i in range(4)))
        await asyncio.gather(*answering)
        assert first.count(Verdict.ADMIT) + second.count(Verdict.ADMIT) == 101
        day = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        async with log.acquire() as conn:
            read: dict[str, Any] = await budget_overshoot(
                conn, agent, budget=201.0, prices=prices, since=day,
                until=day + timedelta(days=1))
        assert (read["spent"], read["overshoot"]) == (202.0, 1.0)
        assert read["overshoot"] <= read["bound"]
    finally:
        await log.close()
