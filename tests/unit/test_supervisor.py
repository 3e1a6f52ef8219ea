"""The supervisor of `intentroute up`: a process that dies is restarted with backoff, a
healthy run resets the backoff, a stop ends everything (fake processes, fake clock)."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence

import pytest

from intentroute.supervisor import FIRST_DELAY, HEALTHY_AFTER, Supervisor
from testkit.clocks import ManualClock
from testkit.procs import FakeProc


def supervisor() -> tuple[Supervisor, list[FakeProc], ManualClock]:
    spawned: list[FakeProc] = []
    clock = ManualClock()

    def spawn(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        proc = FakeProc()
        spawned.append(proc)
        return proc  # type: ignore[return-value]

    return Supervisor(spawn=spawn, clock=clock), spawned, clock


def test_a_dead_worker_is_restarted_after_a_short_backoff() -> None:
    sup, spawned, clock = supervisor()
    slot = sup.add("retriever", ["intentroute", "worker", "retriever"], {})
    spawned[0].returncode = -9  # killed
    clock.now = 1.0
    sup.poll()
    assert slot.proc is None
    assert len(spawned) == 1
    clock.now += FIRST_DELAY
    sup.poll()
    assert len(spawned) == 2
    assert slot.proc is spawned[1]
    assert slot.restarts == 1
    assert slot.history == [(1.0, -9)]


def test_a_crash_loop_backs_off_and_a_healthy_run_resets_it() -> None:
    sup, spawned, clock = supervisor()
    slot = sup.add("classifier", ["worker", "classifier"], {})
    delays = []
    for _ in range(4):
        spawned[-1].returncode = 1
        sup.poll()
        delays.append(slot.restart_at - clock.now)
        clock.now = slot.restart_at
        sup.poll()
    assert delays == pytest.approx([FIRST_DELAY * 2**i for i in range(4)])
    clock.now += HEALTHY_AFTER  # ran long enough: the next death restarts quickly again
    spawned[-1].returncode = 1
    sup.poll()
    assert slot.restart_at - clock.now == pytest.approx(FIRST_DELAY)


def test_stop_signals_every_process_and_restarts_nothing() -> None:
    sup, spawned, _ = supervisor()
    for name in ("gateway", "validator"):
        sup.add(name, ["worker", name], {})
    sup.stop(timeout=1)
    assert all(p.signals == [15] for p in spawned)
    sup.poll()
    assert len(spawned) == 2
