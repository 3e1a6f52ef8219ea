"""The per-agent policy cache: periodic re-reads, last good policies kept on failure."""

from __future__ import annotations

import asyncio

import pytest

from shared.policy.agent import AgentPolicy, ClarityPolicy
from shared.store.policy_cache import NO_POLICY, PolicyCache


class Table:
    """The agent_policies table as the loader reads it; each read is signalled."""

    def __init__(self, policies: dict[str, AgentPolicy]) -> None:
        self.policies = policies
        self.failing: Exception | None = None
        self.reads = 0
        self.read = asyncio.Event()

    async def load(self) -> dict[str, AgentPolicy]:
        self.reads += 1
        self.read.set()
        if self.failing is not None:
            raise self.failing
        return dict(self.policies)

    async def next_read(self) -> None:
        self.read.clear()
        await asyncio.wait_for(self.read.wait(), 5)
        await asyncio.sleep(0)  # let reload() apply what it read


ASK = AgentPolicy(clarity_policy=ClarityPolicy.ASK)


async def test_policies_are_read_at_start_and_unknown_agents_get_the_defaults() -> None:
    table = Table({"ide": ASK})
    cache = PolicyCache(table.load, refresh=30)
    await cache.start()
    try:
        assert cache.policy_for("ide") == ASK
        assert cache.policy_for("ide", "req-1") == ASK
        assert cache.policy_for("chat") is NO_POLICY
    finally:
        await cache.close()


async def test_a_change_in_the_table_is_picked_up_by_the_next_refresh() -> None:
    table = Table({})
    cache = PolicyCache(table.load, refresh=0.05)
    await cache.start()
    try:
        assert cache.policy_for("ide") is NO_POLICY
        table.policies = {"ide": ASK}
        await table.next_read()
        assert cache.policy_for("ide") == ASK
    finally:
        await cache.close()


async def test_a_failed_re_read_keeps_the_last_good_policies() -> None:
    table = Table({"ide": ASK})
    cache = PolicyCache(table.load, refresh=0.05)
    await cache.start()
    try:
        table.failing = OSError("connection refused")
        table.policies = {}
        reads = table.reads
        await table.next_read()
        await table.next_read()
        assert table.reads >= reads + 2  # the refresher survived the failures
        assert cache.policy_for("ide") == ASK
        table.failing = None
        await table.next_read()
        assert cache.policy_for("ide") is NO_POLICY
    finally:
        await cache.close()


async def test_a_failed_first_read_starts_with_the_defaults() -> None:
    table = Table({"ide": ASK})
    table.failing = OSError("database starting")
    cache = PolicyCache(table.load, refresh=0.05)
    await cache.start()
    try:
        assert cache.loaded_at is None
        assert cache.policy_for("ide") is NO_POLICY
        table.failing = None
        await table.next_read()
        assert cache.policy_for("ide") == ASK
    finally:
        await cache.close()


async def test_a_hung_read_times_out_and_keeps_the_last_policies() -> None:
    never = asyncio.Event()

    async def hang() -> dict[str, AgentPolicy]:
        await never.wait()
        return {}

    cache = PolicyCache(hang, refresh=0.05)
    assert not await cache.reload()


async def test_close_stops_the_refresh() -> None:
    table = Table({})
    cache = PolicyCache(table.load, refresh=0.02)
    await cache.start()
    await cache.close()
    reads = table.reads
    await asyncio.sleep(0.1)
    assert table.reads == reads


@pytest.mark.parametrize("refresh", [0, -1, 31, 600])
def test_a_refresh_that_would_miss_the_30_s_pickup_bound_is_refused(refresh: float) -> None:
    with pytest.raises(ValueError, match="POLICY_REFRESH"):
        PolicyCache(Table({}).load, refresh=refresh)


async def test_an_ab_candidate_serves_its_arm_of_the_agents_requests_only() -> None:
    from shared.policy.ab import in_ab_arm

    candidate = AgentPolicy(clarity_threshold=0.8)

    async def candidates() -> dict[str, tuple[AgentPolicy, float]]:
        return {"ide": (candidate, 0.1)}

    cache = PolicyCache(Table({"ide": ASK}).load, refresh=30, candidates=candidates)
    await cache.start()
    try:
        served = {rid: cache.policy_for("ide", rid) for rid in (f"r{i}" for i in range(2000))}
        in_arm = [rid for rid, policy in served.items() if policy == candidate]
        assert in_arm == [rid for rid in served if in_ab_arm("ide", rid, 0.1)]
        assert 120 < len(in_arm) < 280  # ~10% of 2000
        assert all(served[rid] == ASK for rid in served if rid not in in_arm)
        # Without a request id (no request to assign) and for other agents: the base.
        assert cache.policy_for("ide") == ASK
        assert cache.policy_for("chat", "r1") is NO_POLICY
    finally:
        await cache.close()
