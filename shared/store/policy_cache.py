"""Per-agent policies as a running worker sees them: read once at start, then re-read
every `POLICY_REFRESH` seconds in the background, so `intentroute agent set` reaches
running workers without a restart (within 30 s: the refresh may not be longer).

A failed re-read (the database restarting, a timeout) keeps the last good policies and
is logged; the next tick tries again. Lookups are a dict read on the hot path, never a
database round trip.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

import asyncpg

from shared.common.tasks import cancel_and_wait
from shared.policy.ab import effective_policy, load_candidates
from shared.policy.agent import AgentPolicy
from shared.store.policies import load_policies

log = logging.getLogger("intentroute.policy")

Loader = Callable[[], Awaitable[dict[str, AgentPolicy]]]
# Agent id -> (the candidate policy under A/B, the share of its requests that get it).
CandidateLoader = Callable[[], Awaitable[dict[str, tuple[AgentPolicy, float]]]]

# ADR-0006 / issue 14: a policy change reaches running workers within 30 s.
MAX_REFRESH = 30.0
NO_POLICY = AgentPolicy()


class PolicyCache:
    """Every agent's policy, refreshed in the background (`start` / `close`)."""

    def __init__(self, load: Loader, *, refresh: float = 10.0,
                 candidates: CandidateLoader | None = None) -> None:
        if not 0 < refresh <= MAX_REFRESH:
            raise ValueError(f"POLICY_REFRESH={refresh}: must be in (0, {MAX_REFRESH:g}] s "
                             "(a policy change reaches running workers within 30 s)")
        self._load = load
        self._load_candidates = candidates
        self.refresh = refresh
        self._policies: dict[str, AgentPolicy] = {}
        self._candidates: dict[str, tuple[AgentPolicy, float]] = {}
        self._task: asyncio.Task[None] | None = None
        # time.monotonic() of the last successful read (None: never read).
        self.loaded_at: float | None = None

    def policy_for(self, agent_id: str, request_id: str = "") -> AgentPolicy:
        """The agent's policy (the empty policy, i.e. the global defaults, if it has
        none), or the learning job's candidate under A/B when the request is in its
        arm. Every stage asking about the same request gets the same answer: the arm
        is a function of the ids only (`shared.policy.ab`)."""
        base = self._policies.get(agent_id, NO_POLICY)
        candidate = self._candidates.get(agent_id)
        if candidate is None or not request_id:
            return base
        return effective_policy(base, candidate[0], agent_id, request_id, candidate[1])

    async def reload(self) -> bool:
        """Read every policy now; on failure keep the last good ones. True if read."""
        try:
            async with asyncio.timeout(self.refresh):
                policies = await self._load()
                candidates = (await self._load_candidates()
                              if self._load_candidates is not None else {})
        except Exception as exc:  # a background refresher must outlive any failure
            log.warning("per-agent policies not re-read (keeping the last %d): %r",
                        len(self._policies), exc)
            return False
        self._policies, self._candidates = policies, candidates
        self.loaded_at = time.monotonic()
        return True

    async def start(self) -> None:
        """First read (a failure leaves the global defaults until a re-read works),
        then the background refresh."""
        await self.reload()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="policy-refresh")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.refresh)
            await self.reload()

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None


async def open_policy_cache(
    pool: asyncpg.Pool, *, refresh: float, exits: AsyncExitStack, with_candidates: bool = True
) -> PolicyCache:
    """A started cache over `agent_policies`, closed with the worker's exit stack;
    `with_candidates`: with the learning job's A/B candidates (`learning_proposals`);
    without, every agent's own policy only (the doors, whose role reads no proposal)."""

    async def load() -> dict[str, AgentPolicy]:
        return await load_policies(pool)

    async def candidates() -> dict[str, tuple[AgentPolicy, float]]:
        return await load_candidates(pool)

    cache = PolicyCache(load, refresh=refresh,
                        candidates=candidates if with_candidates else None)
    await cache.start()
    exits.push_async_callback(cache.close)
    return cache
