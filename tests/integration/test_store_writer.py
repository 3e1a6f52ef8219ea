"""The group-commit writer on a real Postgres: an unexpected failure fails only the
writes of its batch, and the writer keeps writing."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from shared.store import writer
from shared.store.rows import RequestLogRow
from shared.store.stores import Store, StoreError

pytestmark = pytest.mark.integration


def log_row(request_id: str) -> RequestLogRow:
    return RequestLogRow(request_id=request_id, agent_id="writer-test", session_id="s",
                         outcome="ok")


async def test_writer_survives_an_unexpected_failure(store: Store, monkeypatch) -> None:
    real = writer._write_batch
    calls = {"n": 0}

    async def broken_once(conn, rows, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected: not a database error")
        await real(conn, rows, **kwargs)

    monkeypatch.setattr(writer, "_write_batch", broken_once)
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    with pytest.raises(StoreError, match="injected"):
        await store.write(log_row(first))
    await store.write(log_row(second))  # would wait forever if the writer had died
    stored = {r["request_id"] for r in await store.pool.fetch(
        "SELECT request_id FROM request_log WHERE request_id = ANY($1::text[])", [first, second])}
    assert stored == {second}


async def test_a_connection_broken_mid_statement_is_retried(
    store: Store, monkeypatch
) -> None:
    # asyncpg's InternalClientError: the connection's state broke as the server went
    # away (Postgres shutting down under load). The rows are not the problem: the write
    # is retried like any outage (before, the batch failed as a bug, with a traceback).
    real = writer._write_batch
    calls = {"n": 0}

    async def breaks_once(conn, rows, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 1:
            raise asyncpg.InternalClientError("cannot switch to state 12")
        await real(conn, rows, **kwargs)

    monkeypatch.setattr(writer, "_write_batch", breaks_once)
    request_id = uuid.uuid4().hex
    await store.write(log_row(request_id))
    assert calls["n"] == 2
    assert await store.pool.fetchval(
        "SELECT count(*) FROM request_log WHERE request_id = $1", request_id) == 1


async def test_accounting_fields_of_a_log_row_are_stored(store: Store) -> None:
    request_id = uuid.uuid4().hex
    row = RequestLogRow(request_id=request_id, agent_id="writer-test", session_id="s",
                        outcome="ok", model="qwen2.5:1.5b", tokens_in=120, tokens_out=48,
                        first_chunk_ms=35.5, compute_ms=812.0, fallback=True,
                        fallback_reason="BACKEND_UNAVAILABLE")
    await store.write(row)
    stored = await store.pool.fetchrow(
        "SELECT model, tokens_in, tokens_out, tokens_note, first_chunk_ms, compute_ms,"
        " fallback, fallback_reason FROM request_log WHERE agent_id = $1 AND request_id = $2",
        "writer-test", request_id)
    assert dict(stored) == {
        "model": "qwen2.5:1.5b", "tokens_in": 120, "tokens_out": 48, "tokens_note": "",
        "first_chunk_ms": 35.5, "compute_ms": 812.0, "fallback": True,
        "fallback_reason": "BACKEND_UNAVAILABLE"}


async def test_policies_are_saved_and_read_back_per_agent(store: Store) -> None:
    from shared.policy.agent import AgentPolicy, apply_assignment
    from shared.store.policies import load_policies, load_policy, save_policy

    agent = f"policy-{uuid.uuid4().hex[:8]}"
    assert await load_policy(store.pool, agent) == AgentPolicy()
    policy = apply_assignment(AgentPolicy(), "clarity_threshold=0.72")
    await save_policy(store.pool, agent, policy)
    await save_policy(store.pool, agent, apply_assignment(policy, "slo_p95_ms=300"))
    stored = await load_policy(store.pool, agent)
    assert (stored.clarity_threshold, stored.slo_p95_ms) == (0.72, 300)
    # A hand-broken row is skipped, the others still load.
    await store.pool.execute(
        "INSERT INTO agent_policies (agent_id, settings) VALUES ($1, '{\"x\": 1}')",
        agent + "-bad")
    policies = await load_policies(store.pool)
    assert agent in policies
    assert agent + "-bad" not in policies
