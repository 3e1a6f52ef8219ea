"""The per-agent limits' shared state on a real Postgres, on a fake clock (every call
says what time it is): each limit trips at its value and recovers after its window,
answered requests are settled from their request-log rows, budgets reserve what is in
flight, and two gateways' calls racing on one agent see one count."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest

from services.gateway.limits.ports import Admission, Limits, Verdict
from services.gateway.limits.store import PgLimits, budget_overshoot
from shared.policy.agent import OnBudget
from shared.store import asyncpg_dsn

pytestmark = pytest.mark.integration

# A fake "now": today at 10:00:00 UTC (so a day and a minute start at known times).
T0 = datetime.now(UTC).replace(hour=10, minute=0, second=0, microsecond=0).timestamp()
DEADLINE = 120.0


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(asyncpg_dsn(database_url), min_size=1, max_size=8)
    assert pool is not None
    yield pool
    await pool.close()


class Agent:
    """One fresh agent's requests against the shared state."""

    def __init__(self, store: PgLimits, pool: asyncpg.Pool, limits: Limits,
                 prices: dict[str, list[float]] | None = None) -> None:
        self.id = f"lim-{uuid.uuid4().hex[:10]}"
        self.store, self.pool, self.limits = store, pool, limits
        self.prices = prices or {}
        self.admitted: list[tuple[str, float]] = []

    async def ask(self, now: float, *, deadline: float = DEADLINE) -> Admission:
        request_id = uuid.uuid4().hex
        got = await self.store.admit(self.id, request_id, accepted_at=now,
                                     deadline=now + deadline, limits=self.limits,
                                     prices=self.prices, now=now)
        if got.verdict in (Verdict.ADMIT, Verdict.DEGRADE):
            self.admitted.append((request_id, now))
        return got

    async def answer(self, index: int, *, model: str = "m", tokens_in: int = 0,
                     tokens_out: int = 0) -> None:
        """The request-log row of an admitted request, as an answering stage writes it."""
        request_id, accepted = self.admitted[index]
        await self.pool.execute(
            "INSERT INTO request_log (request_id, agent_id, session_id, outcome, model, "
            "tokens_in, tokens_out, created_at) "
            "VALUES ($1, $2, 's', 'ok', $3, $4, $5, to_timestamp($6::float8))",
            request_id, self.id, model, tokens_in, tokens_out, accepted)


async def test_the_rate_trips_at_its_burst_and_refills_at_its_rate(pool: asyncpg.Pool) -> None:
    agent = Agent(PgLimits(pool), pool, Limits(rate=2.0, burst=3))
    assert [(await agent.ask(T0)).verdict for _ in range(3)] == [Verdict.ADMIT] * 3
    refused = await agent.ask(T0)
    assert refused.verdict == Verdict.RATE_LIMITED
    assert refused.retry_after_ms == 500  # one request at 2/s
    assert (await agent.ask(T0 + 0.25)).verdict == Verdict.RATE_LIMITED
    assert (await agent.ask(T0 + 0.5)).verdict == Verdict.ADMIT
    assert (await agent.ask(T0 + 0.5)).verdict == Verdict.RATE_LIMITED
    # Idle: the bucket fills back to its burst, not beyond.
    later = T0 + 60
    assert [(await agent.ask(later)).verdict for _ in range(4)] == [Verdict.ADMIT] * 3 + [
        Verdict.RATE_LIMITED]


async def test_in_flight_counts_until_the_log_row_or_the_deadline(pool: asyncpg.Pool) -> None:
    agent = Agent(PgLimits(pool), pool, Limits(max_inflight=2))
    assert (await agent.ask(T0)).verdict == Verdict.ADMIT
    assert (await agent.ask(T0, deadline=5)).verdict == Verdict.ADMIT
    refused = await agent.ask(T0 + 1)
    assert refused.verdict == Verdict.CONCURRENCY_LIMITED
    await agent.answer(0)  # its final chunk's row is written: no longer in flight
    assert (await agent.ask(T0 + 1)).verdict == Verdict.ADMIT
    assert (await agent.ask(T0 + 2)).verdict == Verdict.CONCURRENCY_LIMITED
    # The second one's deadline (T0 + 5) passes without an answer: it stops counting.
    assert (await agent.ask(T0 + 5.5)).verdict == Verdict.ADMIT


async def test_tokens_per_minute_from_the_log_slide_out_of_the_window(
        pool: asyncpg.Pool) -> None:
    agent = Agent(PgLimits(pool), pool, Limits(tokens_per_min=100))
    assert (await agent.ask(T0 + 10)).verdict == Verdict.ADMIT
    await agent.answer(0, tokens_in=60, tokens_out=50)  # 110 tokens, settled next ask
    refused = await agent.ask(T0 + 20)
    assert refused.verdict == Verdict.QUOTA_EXCEEDED
    # Next minute the 110 weigh (1 - s/60): below 100 after 60/11 s into it.
    wait = refused.retry_after_ms / 1000
    assert wait == pytest.approx(40 + 60 / 11, abs=0.002)
    assert (await agent.ask(T0 + 20 + wait - 0.5)).verdict == Verdict.QUOTA_EXCEEDED
    assert (await agent.ask(T0 + 20 + wait + 0.01)).verdict == Verdict.ADMIT


async def test_a_budget_reserves_in_flight_refuses_at_its_value_and_resets_next_day(
        pool: asyncpg.Pool) -> None:
    # 1 cost unit per input token: the cost is exact.
    agent = Agent(PgLimits(pool), pool, Limits(budget_day=5.0),
                  prices={"m": [1000.0, 0.0, 0.0]})
    assert (await agent.ask(T0)).verdict == Verdict.ADMIT
    # No cost known yet: one request at a time.
    assert (await agent.ask(T0 + 1)).verdict == Verdict.PROBE
    await agent.answer(0, tokens_in=2)  # cost 2: spent 2, estimate 2
    first = await agent.ask(T0 + 2)
    assert (first.verdict, first.spent_day, first.reserved) == (Verdict.ADMIT, 2.0, 2.0)
    second = await agent.ask(T0 + 3)  # 2 spent + 2 reserved < 5
    assert (second.verdict, second.reserved) == (Verdict.ADMIT, 4.0)
    refused = await agent.ask(T0 + 4)  # 2 + 4 >= 5
    assert refused.verdict == Verdict.BUDGET_EXCEEDED
    assert refused.retry_after_ms == pytest.approx(14 * 3600 * 1000 - 4000, abs=1)
    await agent.answer(1, tokens_in=2)
    await agent.answer(2, tokens_in=2)
    settled = await agent.ask(T0 + 5)
    assert (settled.verdict, settled.spent_day, settled.reserved) == (
        Verdict.BUDGET_EXCEEDED, 6.0, 0.0)
    # Overshoot 1 <= what was reserved at the last admission (4).
    async with pool.acquire() as conn:
        read = await budget_overshoot(
            conn, agent.id, budget=5.0, prices=agent.prices,
            since=datetime.fromtimestamp(T0 - 36000, UTC),
            until=datetime.fromtimestamp(T0 + 50400, UTC))
    assert (read["spent"], read["overshoot"], read["bound"]) == (6.0, 1.0, 4.0)
    # A new UTC day starts at 0; the month keeps counting.
    tomorrow = T0 + 86400
    again = await agent.ask(tomorrow)
    assert (again.verdict, again.spent_day) == (Verdict.ADMIT, 0.0)
    assert again.spent_month == (6.0 if datetime.fromtimestamp(tomorrow, UTC).day > 1 else 0.0)


async def test_degrade_admits_past_the_budget_without_reserving(pool: asyncpg.Pool) -> None:
    agent = Agent(PgLimits(pool), pool, Limits(budget_month=1.0, on_budget=OnBudget.DEGRADE),
                  prices={"m": [1000.0, 0.0, 0.0]})
    assert (await agent.ask(T0)).verdict == Verdict.ADMIT
    await agent.answer(0, tokens_in=1)
    degraded = await agent.ask(T0 + 1)
    assert (degraded.verdict, degraded.spent_month, degraded.reserved) == (
        Verdict.DEGRADE, 1.0, 0.0)
    assert (await agent.ask(T0 + 2)).verdict == Verdict.DEGRADE


@pytest.mark.parametrize(("limits", "admitted", "refused"), [
    (Limits(rate=1.0, burst=10), 10, Verdict.RATE_LIMITED),
    (Limits(max_inflight=8), 8, Verdict.CONCURRENCY_LIMITED),
])
async def test_two_gateways_racing_on_one_agent_share_one_count(
        pool: asyncpg.Pool, database_url: str, limits: Limits, admitted: int,
        refused: Verdict) -> None:
    """Two stores on their own pools (two replicas) ask for 40 requests of one agent at
    once: exactly the limit gets in, whichever replica asked, the rest are refused."""
    other = await asyncpg.create_pool(asyncpg_dsn(database_url), min_size=1, max_size=8)
    assert other is not None
    try:
        stores = [PgLimits(pool), PgLimits(other)]
        agent_id = f"lim-{uuid.uuid4().hex[:10]}"
        verdicts = await asyncio.gather(*(
            stores[i % 2].admit(agent_id, uuid.uuid4().hex, accepted_at=T0, deadline=T0 + 60,
                                limits=limits, prices={}, now=T0) for i in range(40)))
    finally:
        await other.close()
    got = [a.verdict for a in verdicts]
    assert (got.count(Verdict.ADMIT), got.count(refused)) == (admitted, 40 - admitted)
