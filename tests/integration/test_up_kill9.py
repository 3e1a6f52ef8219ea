"""`intentroute up` killed with SIGKILL under load takes its stack with it: nats-server,
Postgres, the parser and every worker get their clean stop signal from the kernel
(SIGTERM; Postgres SIGINT, its fast shutdown) and are gone within seconds, and a next
`up` started at once in the same state directory comes up on the same ports and answers
every request the first left, once."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import nats
import pytest

from bench.sigint import (
    Finals,
    Up,
    _answered,
    _quiet,
    _request,
    children,
    command,
    stored_finals,
    up_env,
)
from intentroute.stack.nats_users import DEMO_AGENT, admin_kwargs, auth_files
from intentroute.workers import WORKERS
from shared.auth.natsconn import read_credential
from shared.client.caller import publish_until_stored
from shared.common.settings import nats_servers
from shared.contracts.response import agent_responses
from testkit.procs import process_gone

pytestmark = pytest.mark.integration

# Measured: every process gone 0.3-1.5 s after the kill (1 replica of each worker,
# load average 8-10 on the shared 2-core machine).
GONE_WITHIN = 10.0
REQUESTS = 60


async def _settled(finals: Finals, ids: list[str], servers: list[str], admin: dict[str, Any],
                   timeout: float) -> bool:
    """Until every request has a final, seen live or stored in AGENT_RESPONSES: a worker
    finishing its answer as the first `up` went down had it stored while the server was
    already closing the caller's connection, and the second `up` does not answer again
    what has its final (one final per request), so the caller never sees it live."""
    deadline = time.monotonic() + timeout
    while True:
        missing = [rid for rid in ids if rid not in finals.finals]
        if not missing:
            return True
        stored = await stored_finals(servers, admin)
        if all(stored[rid] for rid in missing):
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(1.0)


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    for child in children(pid):
        found += [child, *_descendants(child)]
    return found


@pytest.mark.timeout(600)
async def test_kill_9_of_up_stops_its_children_and_the_next_up_answers_what_it_left(
        tmp_path: Path, kb_index: Path) -> None:
    home = tmp_path / "home"
    env = up_env(home, kb_index)
    env.pop("AVAP_PARSER_TIMEOUT")  # the parser too: every kind of process `up` starts
    first = Up(env, tmp_path / "up1.log").start()
    second = Up(env, tmp_path / "up2.log")
    finals = Finals()
    try:
        state = await asyncio.to_thread(first.state)
        cred = read_credential(auth_files(home).credential(DEMO_AGENT))
        # One caller through both `up`s (the next one keeps the ports).
        nc = await nats.connect(nats_servers(state.nats_url), **cred.nats,
                                reconnect_time_wait=0.2, max_reconnect_attempts=-1,
                                error_cb=_quiet)
        await nc.subscribe(agent_responses(DEMO_AGENT), cb=finals.on_chunk)
        warm = _request(0)
        await publish_until_stored(nc, warm, give_up_at=time.monotonic() + 60)
        assert await _answered(finals, [warm.request_id], 180), first.output()[-2000:]
        tree = _descendants(first.pid)
        commands = " | ".join(command(pid) for pid in tree)
        for expected in ("nats-server", "bin/postgres", " parser ",
                         *(f"worker {name}" for name in WORKERS)):
            assert expected in commands, commands
        batch = [_request(i) for i in range(1, REQUESTS + 1)]
        ids = [r.request_id for r in batch]
        await asyncio.gather(*(publish_until_stored(nc, r, give_up_at=time.monotonic() + 60)
                               for r in batch))
        await _answered(finals, ids, 60, count=REQUESTS // 20)  # mid-stream

        os.kill(first.pid, signal.SIGKILL)
        killed = time.monotonic()
        await asyncio.to_thread(first.wait, 10)
        second.start()  # at once, as an operator would
        left = tree
        while left and time.monotonic() - killed < GONE_WITHIN:
            await asyncio.sleep(0.05)
            left = [pid for pid in left if not process_gone(pid)]
        gone_s = time.monotonic() - killed
        answered_before = sum(1 for rid in ids if rid in finals.finals)
        print(f"{len(tree)} processes gone {gone_s:.2f}s after the kill; "
              f"{answered_before} of {REQUESTS} answered before it")
        assert not left, [(pid, command(pid)) for pid in left]
        # Each by its clean stop, not killed: nats-server trapped SIGTERM, Postgres took
        # SIGINT as a fast shutdown, no process died with a traceback.
        nats_log = (home / "nats" / "nats-server.log").read_text()
        assert 'Trapped "terminated" signal' in nats_log, nats_log[-2000:]
        pg_log = (home / "postgres" / "postgres.log").read_text()
        assert "received fast shutdown request" in pg_log, pg_log[-2000:]
        # (asyncpg's pool, refused by a Postgres in fast shutdown, says in one line that
        # it tries again: shared.runtime.logs.PoolRetryLines.)
        output = first.output()
        assert "Traceback" not in output, output[-3000:]

        again = await asyncio.to_thread(second.state)
        assert again.nats_url == state.nats_url  # the same ports: nothing held them
        assert again.database_url == state.database_url
        assert again.gateway_http_url == state.gateway_http_url
        # What the first left (queued, or unacknowledged when it died) is answered by
        # the second, once.
        assert await _settled(finals, ids, nats_servers(again.nats_url), admin_kwargs(home),
                              240), second.output()[-2000:]
        stored = await stored_finals(nats_servers(again.nats_url), admin_kwargs(home))
        await nc.close()
    finally:
        second.stop()
        first.stop()
    assert [rid for rid in ids if len(finals.finals[rid]) > 1] == []  # never two live
    assert [rid for rid in ids if stored[rid] != 1] == []
    assert second.proc is not None
    assert second.proc.returncode == 0, second.output()[-3000:]
    assert "Traceback" not in second.output(), second.output()[-3000:]
