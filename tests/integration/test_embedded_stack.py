"""The embedded stack as `make run` starts it: state in a relative `.intentroute`."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import nats
import pytest

from intentroute.stack import embedded_stack
from intentroute.stack.nats_users import admin_kwargs

pytestmark = pytest.mark.integration


async def test_embedded_stack_starts_from_a_relative_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with embedded_stack(Path(".intentroute")) as (nats_url, database_url):
        # The embedded server admits credentials only: the admin's is in the state dir.
        nc = await nats.connect(nats_url, **admin_kwargs(Path(".intentroute")))
        info = await nc.jetstream().account_info()
        await nc.close()
        conn = await asyncpg.connect(database_url)
        one = await conn.fetchval("SELECT 1")
        await conn.close()
    assert info.limits is not None
    assert one == 1
    assert (tmp_path / ".intentroute" / "postgres" / "pgdata" / "PG_VERSION").exists()
