"""Ctrl-C under load: `intentroute up`, run as a terminal runs it (a process group of its
own), gets SIGINT on its whole process group while requests are in flight; then a
second `up` in the same state directory answers what the first left.

Reports (the `sigint_process_group` scenario of `intentroute bench chaos --json`):
sent, answered_once (one final seen live, by a caller connected through both `up`s),
answered_before_exit, lost (no final, live or stored, by the deadline),
duplicate_finals (more than one distinct final live, or stored), drain_s (signal ->
the first `up` exited), stall_s (the second `up` started -> its first answer),
servers_stopped_last (no worker outlived nats-server or Postgres), tracebacks (lines
"Traceback" in the first `up`'s output: its own and its children's).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import nats
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from intentroute.stack.nats_users import DEMO_AGENT, admin_kwargs, auth_files
from intentroute.stack.state import StackInfo, read_state
from shared.auth.natsconn import read_credential
from shared.client.caller import publish_until_stored
from shared.common.settings import nats_servers
from shared.contracts import response
from shared.contracts.codec import decode_chunk
from shared.contracts.request import AgentRequest
from shared.contracts.response import agent_responses
from testkit.procs import process_gone

QUERIES = ["What does addParam do?", "how do I loop from 1 to 10 in AVAP?",
           "en menos palabras", "write an endpoint that returns the user id"]


def up_env(home: Path, index_dir: Path, **extra: str) -> dict[str, str]:
    """A clean environment for `up` in `home`: the echo generator (0.4 s per answer, so
    requests are in flight when the signal comes), no parser, quiet logs."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NATS_", "DATABASE_", "GATEWAY_", "INTENTROUTE_", "LEARN_"))}
    env.update(INTENTROUTE_HOME=str(home), INDEX_DIR=str(index_dir), HF_HUB_OFFLINE="1",
               LOG_LEVEL="WARNING", GENERATOR_BACKEND="echo", GENERATOR_ECHO_DELAY="0.4",
               AVAP_PARSER_TIMEOUT="0", LEARN_INTERVAL="3600", **extra)
    return env


class Up:
    """One `intentroute up` in a session of its own (as a terminal starts it)."""

    def __init__(self, env: dict[str, str], log: Path, *args: str) -> None:
        self.env = env
        self.home = Path(env["INTENTROUTE_HOME"])
        self.log = log
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def start(self) -> Up:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "intentroute.cli", "up", *self.args], env=self.env,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.started = time.monotonic()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def state(self, timeout: float = 180.0) -> StackInfo:
        """stack.json once this `up` wrote it (its workers are starting)."""
        deadline = time.monotonic() + timeout
        while True:
            state = read_state(self.home) if (self.home / "stack.json").exists() else None
            if state is not None and state.pid == self.pid:
                return state
            assert self.proc is not None
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"`up` did not start: {self.output()[-2000:]}")
            time.sleep(0.2)

    def interrupt_group(self) -> None:
        """What a terminal's Ctrl-C does: SIGINT to the foreground process group."""
        os.killpg(self.pid, signal.SIGINT)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            found += [int(p) for p in (task / "children").read_text().split()]
    return found


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""




class DeathWatch:
    """When each of some processes exited (monotonic), polled every 10 ms."""

    def __init__(self, pids: dict[int, str]) -> None:
        self.pids = pids
        self.died: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> DeathWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set() and len(self.died) < len(self.pids):
            for pid in self.pids:
                if pid not in self.died and process_gone(pid):
                    self.died[pid] = time.monotonic()
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def stack_processes(up_pid: int, home: Path) -> tuple[dict[int, str], dict[int, str]]:
    """(workers and helpers, servers) of a running `up`, by pid."""
    servers: dict[int, str] = {}
    others: dict[int, str] = {}
    for pid in children(up_pid):
        cmd = command(pid)
        if "nats-server" in cmd:
            servers[pid] = "nats-server"
        elif "/postgres " in cmd or cmd.split(" ", 1)[0].endswith("postgres"):
            servers[pid] = "postgres"
        elif cmd:
            others[pid] = cmd.split("intentroute.cli ", 1)[-1].strip()
    return others, servers


class Finals:
    """Distinct final chunks per request as a live subscriber sees them."""

    def __init__(self) -> None:
        self.finals: dict[str, set[bytes]] = defaultdict(set)
        self.first: dict[str, float] = {}

    async def on_chunk(self, msg: Msg) -> None:
        chunk = decode_chunk(msg.data)
        if chunk.is_final:
            self.finals[chunk.request_id].add(msg.data)
            self.first.setdefault(chunk.request_id, time.monotonic())


async def count_stored_finals(nc: nats.NATS, agent: str, name: str) -> Counter[str]:
    """Final chunks per request of `agent` as AGENT_RESPONSES stored them, read through
    an ephemeral push consumer named `name-<random>` (the chaos bench reads the same)."""
    counts: Counter[str] = Counter()
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.jetstream().add_consumer(response.STREAM, ConsumerConfig(
        name=f"{name}-{uuid.uuid4().hex[:6]}", filter_subject=agent_responses(agent),
        deliver_subject=inbox, deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE,
        inactive_threshold=10.0, mem_storage=True))
    while True:
        try:
            msg = await sub.next_msg(timeout=1.0)
        except nats.errors.TimeoutError:
            break
        chunk = decode_chunk(msg.data)
        if chunk.is_final:
            counts[chunk.request_id] += 1
    return counts


async def stored_finals(servers: list[str], admin: dict[str, Any]) -> Counter[str]:
    """Final chunks per request as AGENT_RESPONSES stored them (the demo agent's)."""
    nc = await nats.connect(servers, **admin)
    try:
        return await count_stored_finals(nc, DEMO_AGENT, "sigint-count")
    finally:
        await nc.close()


async def _quiet(_: Exception) -> None:
    """The caller's reconnect attempts while no `up` runs are expected."""


def _request(i: int) -> AgentRequest:
    return AgentRequest(request_id=uuid.uuid4().hex, session_id=f"sigint-{i % 20}",
                        agent_id=DEMO_AGENT, query=QUERIES[i % len(QUERIES)])


async def _answered(finals: Finals, ids: list[str], timeout: float, count: int = 0) -> bool:
    """Until `count` (default all) of `ids` have a final, or the timeout."""
    want = count or len(ids)
    deadline = time.monotonic() + timeout
    while sum(1 for rid in ids if rid in finals.finals) < want:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def sigint_under_load(home: Path, index_dir: Path, *, requests: int = 300,
                            deadline: float = 240.0, replicas: str = "") -> dict[str, Any]:
    """The scenario of the module doc; `home` is a fresh state directory."""
    env = up_env(home, index_dir)
    args = ("--replicas", replicas) if replicas else ()
    first = Up(env, home.parent / f"{home.name}-up1.log", *args).start()
    second: Up | None = None
    finals = Finals()
    try:
        state = await asyncio.to_thread(first.state)
        servers = nats_servers(state.nats_url)
        cred = read_credential(auth_files(home).credential(DEMO_AGENT))
        # One caller through both `up`s: the next one keeps the ports (docs/guides/
        # operations/reliability.md, stable addresses), so this connection reconnects to it.
        nc = await nats.connect(servers, **cred.nats, reconnect_time_wait=0.2,
                                max_reconnect_attempts=-1, error_cb=_quiet)
        await nc.subscribe(agent_responses(DEMO_AGENT), cb=finals.on_chunk)
        warm = _request(0)
        await publish_until_stored(nc, warm, give_up_at=time.monotonic() + 60)
        if not await _answered(finals, [warm.request_id], 180):
            raise RuntimeError(f"no first answer: {first.output()[-2000:]}")
        workers, server_pids = stack_processes(first.pid, home)
        watch = DeathWatch({**workers, **server_pids}).start()
        batch = [_request(i) for i in range(requests)]
        ids = [r.request_id for r in batch]
        await asyncio.gather(*(publish_until_stored(nc, r, give_up_at=time.monotonic() + 60)
                               for r in batch))
        # Mid-stream: some answered, most still queued or in the pipeline.
        await _answered(finals, ids, 60, count=max(1, requests // 20))
        signalled = time.monotonic()
        first.interrupt_group()
        code = await asyncio.to_thread(first.wait, 180)
        exited = time.monotonic()
        watch.stop()
        before_exit = {rid for rid in ids if rid in finals.finals}
        second = Up(env, home.parent / f"{home.name}-up2.log", *args).start()
        await asyncio.to_thread(second.state)
        await _answered(finals, ids, deadline)
        stall = min((t for rid, t in finals.first.items() if t > second.started),
                    default=time.monotonic()) - second.started
        stored = await stored_finals(servers, admin_kwargs(home))
        await nc.close()
    finally:
        first.stop()
        if second is not None:
            second.stop()
    worker_deaths = [watch.died.get(pid, exited) for pid in workers]
    server_deaths = [watch.died.get(pid, exited) for pid in server_pids]
    duplicates = [rid for rid in ids if max(len(finals.finals.get(rid, ())), stored[rid]) > 1]
    answered = [rid for rid in ids if finals.finals.get(rid) or stored[rid]]
    return {
        "sent": len(ids),
        "answered_once": sum(1 for rid in ids if len(finals.finals.get(rid, ())) == 1
                             and rid not in duplicates),
        "answered_before_exit": len(before_exit),
        "lost": len(ids) - len(answered),
        "duplicate_finals": len(duplicates),
        "drain_s": round(exited - signalled, 3),
        "stall_s": round(stall, 3),
        "exit_code": code,
        "servers_stopped_last": max(worker_deaths, default=0.0) <= min(server_deaths,
                                                                       default=exited),
        "tracebacks": first.output().count("Traceback"),
    }


def run(requests: int = 300) -> dict[str, Any]:
    """The scenario on a fresh state directory and the demo knowledge base."""
    import tempfile

    from services.retriever.indexing.embedded_ingest import ingest
    from shared.encoders.embeddings import SentenceTransformerEncoder

    with tempfile.TemporaryDirectory(prefix="ir-sigint-") as tmp:
        index = Path(tmp) / "index"
        ingest(Path(__file__).resolve().parents[2] / "kb" / "avap", index,
               SentenceTransformerEncoder(), progress=False)
        return asyncio.run(sigint_under_load(Path(tmp) / "home", index, requests=requests))


if __name__ == "__main__":
    import json

    print(json.dumps(run()))
