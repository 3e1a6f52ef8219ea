"""The group-commit writer on a real Postgres: an unexpected failure fails only the
writes of its batch, and the writer keeps writing."""

from __future__ import annotations

import uuid

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

    async def broken_once(conn, rows):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected: not a database error")
        await real(conn, rows)

    monkeypatch.setattr(writer, "_write_batch", broken_once)
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    with pytest.raises(StoreError, match="injected"):
        await store.write(log_row(first))
    await store.write(log_row(second))  # would wait forever if the writer had died
    stored = {r["request_id"] for r in await store.pool.fetch(
        "SELECT request_id FROM request_log WHERE request_id = ANY($1::text[])", [first, second])}
    assert stored == {second}
