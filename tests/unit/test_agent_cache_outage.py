"""The gateway's agent cache during a Postgres pause: a known agent stays admitted."""

from __future__ import annotations

import asyncio

import pytest

from shared.auth import identity
from shared.auth.identity import AgentSecret, CachedAgents
from shared.auth.ports import AgentInfo
from testkit.clocks import ManualClock


async def test_an_expired_record_is_kept_while_the_database_does_not_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(identity, "STALE_WAIT", 0.01)
    record = AgentSecret(AgentInfo("agent-a", trusted=True), "hash")
    calls: list[str] = []
    paused = asyncio.Event()

    async def fetch(agent_id: str) -> AgentSecret | None:
        calls.append(agent_id)
        if paused.is_set():
            await asyncio.Event().wait()  # Postgres stopped: never answers
        return record

    clock = ManualClock()
    agents = CachedAgents(fetch, ttl=5.0, clock=clock)
    assert await agents.get("agent-a") == record.info
    paused.set()
    clock.now = 6.0  # expired
    assert await agents.get("agent-a") == record.info
    assert len(calls) == 2
    clock.now = 6.5  # within STALE_RETRY: not asked again
    assert await agents.get("agent-a") == record.info
    assert len(calls) == 2
    paused.clear()
    clock.now = 7.5  # asked again, and answered
    assert await agents.get("agent-a") == record.info
    assert len(calls) == 3
    # An agent never seen is not made up: its first read waits for the database.
    paused.set()
    unknown = asyncio.ensure_future(agents.get("agent-b"))
    await asyncio.sleep(0.05)
    assert not unknown.done()
    unknown.cancel()
