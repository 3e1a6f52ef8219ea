"""Outages ridden out, with exact counts: a nats-server restart, a Postgres outage, a
poisoned row; every request answered once, every answered turn's rows stored."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from shared.client.caller import ask
from shared.contracts.request import AgentRequest
from shared.store.rows import RequestLogRow, TurnRow
from shared.store.stores import Store, StoreRejectedError
from tests.helpers.outage import AGENT, OwnStack, own_stack
from tests.helpers.pipeline import base_env, running

pytestmark = pytest.mark.integration

WORKERS = ("gateway", "classifier", "generator-conversational")


@pytest.fixture(scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[OwnStack]:
    async with own_stack(tmp_path_factory.mktemp("outages")) as own:
        yield own


def platform_request(i: int) -> AgentRequest:
    return AgentRequest(request_id=uuid.uuid4().hex, session_id=f"o-{i % 5}", agent_id=AGENT,
                        query="how many calls do I have left this month?",
                        extra_context=f"calls_used={i} monthly_calls=2000")


async def answer(nc: Any, req: AgentRequest, timeout: float = 60) -> list[Any]:
    return [c async for c in ask(nc, req, timeout=timeout)]


def env_for(stack: OwnStack, kb_index: Path, **extra: str) -> dict[str, str]:
    return base_env(stack.nats_url, stack.database_url, kb_index,
                    INTENTROUTE_HOME=str(stack.state_dir), **extra)


async def test_consumers_resume_within_two_seconds_of_a_nats_restart(
    stack: OwnStack, kb_index: Path
) -> None:
    nc = await stack.connect_agent()
    try:
        async with running(env_for(stack, kb_index), WORKERS):
            assert (await answer(nc, platform_request(0)))[-1].error is None
            stack.nats.stop()
            await asyncio.sleep(1.0)
            stack.nats.start()
            back = time.monotonic()
            # The first request after the restart (nats-py holds the publish until it has
            # reconnected); the stall is until its answer.
            chunks = await answer(nc, platform_request(1), timeout=30)
            stall = time.monotonic() - back
    finally:
        await nc.close()
    assert chunks[-1].is_final
    assert chunks[-1].error is None
    assert stall < 2.0, f"answered {stall:.2f}s after the server was back"


async def test_a_ten_second_postgres_outage_loses_no_answer_and_no_row(
    stack: OwnStack, kb_index: Path
) -> None:
    nc = await stack.connect_agent()
    requests = [platform_request(i) for i in range(20)]
    try:
        async with running(env_for(stack, kb_index), WORKERS):
            assert (await answer(nc, platform_request(99)))[-1].error is None

            async def paced(i: int, req: AgentRequest) -> list[Any]:
                await asyncio.sleep(i * 0.6)  # spread over the outage and after it
                return await answer(nc, req, timeout=90)

            pending = [asyncio.create_task(paced(i, r)) for i, r in enumerate(requests)]
            await asyncio.sleep(1.0)
            stack.pg.stop()
            await asyncio.sleep(10.0)
            stack.pg.start()
            results = await asyncio.gather(*pending)
            # Rows of turns answered during the outage were queued on the bus
            # (shared.runtime.row_queue): the workers' row writer stores them now.
            ids = [r.request_id for r in requests]
            for _ in range(120):
                counts = await row_counts(stack, ids)
                if min(counts.values()) >= len(ids):
                    break
                await asyncio.sleep(0.25)
    finally:
        await nc.close()
    finals = [[c for c in chunks if c.is_final] for chunks in results]
    assert [len(f) for f in finals] == [1] * len(requests)
    assert [f[0].error for f in finals] == [None] * len(requests)
    assert counts == {"request_log": 20, "classify_history": 20, "messages": 20}


async def row_counts(stack: OwnStack, ids: list[str]) -> dict[str, int]:
    store = await Store.connect(stack.database_url)
    try:
        counts = {}
        for table, role in (("request_log", ""), ("classify_history", ""),
                            ("messages", "assistant")):
            where = " AND role = 'assistant'" if role else ""
            counts[table] = await store.pool.fetchval(
                f"SELECT count(*) FROM {table} WHERE agent_id = $1 "
                f"AND request_id = ANY($2::text[]){where}", AGENT, ids)
    finally:
        await store.close()
    return counts


async def test_a_poisoned_row_fails_alone(stack: OwnStack) -> None:
    store = await Store.connect(stack.database_url)
    try:
        good = [RequestLogRow(request_id=uuid.uuid4().hex, agent_id=AGENT, session_id="p",
                              outcome="ok") for _ in range(5)]
        bad = TurnRow(agent_id=AGENT, session_id="p", request_id=uuid.uuid4().hex,
                      query="NUL \x00 inside", answer="a", query_type="RETRIEVAL")
        results = await asyncio.gather(*(store.write(r) for r in good), store.write(bad),
                                       return_exceptions=True)
        stored = await store.pool.fetchval(
            "SELECT count(*) FROM request_log WHERE request_id = ANY($1::text[])",
            [r.request_id for r in good])
    finally:
        await store.close()
    assert results[:5] == [None] * 5
    assert isinstance(results[5], StoreRejectedError)
    assert stored == 5
