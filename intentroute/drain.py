"""How `intentroute up` stops: a drain in the order of the pipeline, the servers last.

The workers and servers `up` starts run in sessions of their own, so the terminal's
Ctrl-C (SIGINT to the foreground process group) reaches `up` alone and `up` decides the
order. On the first SIGINT, SIGTERM or SIGHUP:

1. the doors and the gateways get SIGTERM: no new request is taken (what waits in
   AGENT_REQUESTS stays there for the next `up`); each hands off what it holds and exits;
2. the other workers keep running until the pipeline holds nothing (every consumer of
   INTENTROUTE_PIPELINE has no message pending or unacknowledged, twice in a row: a
   message moving between stages is never unseen in both passes) or the drain timeout
   (`UP_DRAIN_TIMEOUT`, `--drain-timeout`) has passed;
3. the workers, then the parser and the local model, get SIGTERM (each finishes what it
   holds) and SIGKILL after `STOP_GRACE`;
4. then `up` stops the auth sync, Postgres and nats-server (the caller's job).

A second signal stops at once: SIGKILL to every process still running, then the
servers. Nothing is lost either way: what a worker did not acknowledge is redelivered
by the next `up`.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from intentroute.supervisor import Supervisor

# Default bound of steps 1-2; a generation on a slow model can take tens of seconds.
DEFAULT_DRAIN_TIMEOUT = 30.0
# Step 3: a worker's broker waits up to 10 s for its handlers (graceful_timeout in
# shared.runtime.streams.make_broker); a little more before SIGKILL.
STOP_GRACE = 15.0
# Who takes new work, and who serves the workers (stopped after them).
ENTRY = frozenset({"doors", "gateway"})
HELPERS = frozenset({"parser", "llm"})
POLL = 0.05


class StopSignals:
    """Counts SIGINT / SIGTERM / SIGHUP: one asks for a drain, two for a stop at once.
    (SIGHUP too: `up`'s children no longer share its terminal, so a closed terminal
    must reach them through `up`.)"""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.count = 0

    def install(self) -> StopSignals:
        for sig in self.SIGNALS:
            signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, *_: object) -> None:
        self.count += 1

    @property
    def requested(self) -> bool:
        return self.count >= 1

    @property
    def forced(self) -> bool:
        return self.count >= 2


def interrupt_on_stop_signals() -> None:
    """Until `StopSignals.install`: SIGTERM and SIGHUP interrupt like Ctrl-C, so the
    start-up's `with` blocks stop the servers already started."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)


class DrainReport(NamedTuple):
    seconds: float
    # Pipeline messages still pending or unacknowledged when the workers were stopped
    # (-1: not known, the pipeline could not be read); they wait for the next `up`.
    left: int
    killed: int
    forced: bool


# Waits until the pipeline is empty, the monotonic deadline passes or `forced()` is
# true; returns the messages left (-1 when the pipeline cannot be read).
WaitIdle = Callable[[float, Callable[[], bool]], int]


def drain(supervisor: Supervisor, signals: StopSignals, wait_idle: WaitIdle | None, *,
          timeout: float = DEFAULT_DRAIN_TIMEOUT, grace: float = STOP_GRACE,
          tick: Callable[[], object] | None = None, say: Callable[[str], None] | None = None,
          clock: Callable[[], float] = time.monotonic) -> DrainReport:
    """Stop `supervisor`'s processes in the order of the module doc; `tick` runs while it
    waits (`up` keeps its servers alive meanwhile)."""
    say = say or _say
    supervisor.stopping = True  # nothing is restarted from here on
    start = clock()
    deadline = start + timeout

    def stop_now() -> bool:
        if tick is not None:
            tick()
        return signals.forced

    entry = [s.proc for s in supervisor.slots if s.name in ENTRY]
    helpers = [s.proc for s in supervisor.slots if s.name in HELPERS]
    workers = [s.proc for s in supervisor.slots
               if s.name not in ENTRY and s.name not in HELPERS]
    left = -1
    if not signals.forced:
        _terminate(entry)
        _wait(entry, deadline, stop_now, clock)
    if not signals.forced and wait_idle is not None:
        left = wait_idle(deadline, stop_now)
        if not signals.forced:
            say(_pipeline_line(left, clock() - start, timeout))
    killed = 0
    for group in (workers, helpers):
        if not signals.forced:
            _terminate(group)
            _wait(group, clock() + grace, stop_now, clock)
        killed += _kill(group)
    killed += _kill(entry)
    if signals.forced:
        say("intentroute up: second signal: stopped at once")
    elif killed:
        say(f"intentroute up: {killed} process(es) did not stop in {grace:g}s: killed")
    return DrainReport(round(clock() - start, 3), left, killed, signals.forced)


def _pipeline_line(left: int, seconds: float, timeout: float) -> str:
    if left == 0:
        return f"intentroute up: pipeline drained in {seconds:.1f}s"
    if left > 0:
        return (f"intentroute up: drain timeout ({timeout:g}s): {left} pipeline message(s) "
                "left for the next `up`")
    return "intentroute up: the pipeline cannot be read; stopping the workers now"


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


Procs = Iterable["subprocess.Popen[bytes] | None"]


def _running(procs: Procs) -> list[subprocess.Popen[bytes]]:
    return [p for p in procs if p is not None and p.poll() is None]


def _terminate(procs: Procs) -> None:
    for proc in _running(procs):
        proc.send_signal(signal.SIGTERM)


def _wait(procs: Procs, deadline: float, stop_now: Callable[[], bool],
          clock: Callable[[], float]) -> None:
    """Until they have all exited, the deadline has passed or a second signal came."""
    procs = list(procs)
    while _running(procs) and clock() < deadline and not stop_now():
        time.sleep(POLL)


def _kill(procs: Procs) -> int:
    running = _running(procs)
    for proc in running:
        proc.kill()
    for proc in running:
        with contextlib.suppress(subprocess.TimeoutExpired):  # uninterruptible: leave it
            proc.wait(5)
    return len(running)


async def pipeline_in_flight(js: object) -> int:
    """Messages pending or unacknowledged on every consumer of the pipeline stream."""
    from shared.contracts import pipeline

    infos = await js.consumers_info(pipeline.STREAM)  # type: ignore[attr-defined]
    return sum(int(i.num_pending or 0) + int(i.num_ack_pending or 0) for i in infos)


def nats_wait_idle(servers: list[str], connect_kwargs: dict[str, object]) -> WaitIdle:
    """A WaitIdle reading the pipeline's consumers over one NATS connection."""
    import asyncio

    async def run(deadline: float, forced: Callable[[], bool]) -> int:
        import nats

        try:
            nc = await nats.connect(servers, max_reconnect_attempts=2, connect_timeout=2,
                                    **connect_kwargs)
        except Exception:  # no server or no permission: cannot tell
            return -1
        try:
            js = nc.jetstream()
            zero_passes = 0
            left = -1
            while True:
                try:
                    left = await pipeline_in_flight(js)
                except Exception:  # e.g. no permission on an external server
                    return -1
                zero_passes = zero_passes + 1 if left == 0 else 0
                if zero_passes >= 2 or forced() or time.monotonic() >= deadline:
                    return left
                await asyncio.sleep(0.1)
        finally:
            await nc.close()

    return lambda deadline, forced: asyncio.run(run(deadline, forced))
