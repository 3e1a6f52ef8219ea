"""Keeps `intentroute up`'s processes running: a worker that dies is restarted (with
backoff, logged); only a stop (Ctrl-C / SIGTERM) ends them, each given time to drain."""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from intentroute.stack.procs import die_with_parent

log = logging.getLogger("intentroute.supervisor")

# Restart delays: the first restart is quick (a killed replica's work is waiting), a
# process that keeps dying backs off; one that ran this long counts as healthy again.
FIRST_DELAY = 0.2
MAX_DELAY = 10.0
HEALTHY_AFTER = 30.0

Spawn = Callable[[Sequence[str], Mapping[str, str]], "subprocess.Popen[bytes]"]


def _spawn(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    # A session of its own: the terminal's Ctrl-C (SIGINT to the foreground process
    # group) reaches `up` alone, which stops the processes in order (intentroute.drain).
    # SIGTERM (the worker drains and exits) should `up` die without stopping it.
    return subprocess.Popen(list(argv), env=dict(env), start_new_session=True,
                            preexec_fn=die_with_parent(signal.SIGTERM))


@dataclass
class Supervised:
    """One process slot: what to run, its current process, its restart history."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    failures: int = 0
    restart_at: float = 0.0
    restarts: int = 0
    history: list[tuple[float, int]] = field(default_factory=list)  # (when, exit code)


class Supervisor:
    def __init__(self, *, spawn: Spawn = _spawn,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.slots: list[Supervised] = []
        self._spawn = spawn
        self._clock = clock
        self.stopping = False

    def add(self, name: str, argv: Sequence[str], env: Mapping[str, str]) -> Supervised:
        slot = Supervised(name, argv, env)
        self.slots.append(slot)
        self._start(slot)
        return slot

    def _start(self, slot: Supervised) -> None:
        slot.proc = self._spawn(slot.argv, slot.env)
        slot.started = self._clock()

    def poll(self) -> None:
        """Restart what died (once its backoff has passed); call it often."""
        if self.stopping:
            return
        now = self._clock()
        for slot in self.slots:
            proc = slot.proc
            if proc is not None and proc.poll() is not None:
                code = proc.returncode
                slot.history.append((now, code))
                slot.failures = 1 if now - slot.started >= HEALTHY_AFTER else slot.failures + 1
                delay = min(MAX_DELAY, FIRST_DELAY * 2 ** (slot.failures - 1))
                slot.restart_at = now + delay
                slot.proc = None
                log.warning("%s (pid %d) exited with %s; restarting in %.1fs", slot.name,
                            proc.pid, code, delay)
            if slot.proc is None and now >= slot.restart_at:
                self._start(slot)
                slot.restarts += 1
                log.warning("%s restarted (pid %d, restart %d)", slot.name,
                            slot.proc.pid if slot.proc else 0, slot.restarts)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM to all (each drains: stops pulling, finishes what it holds), then
        SIGKILL what is still running after `timeout`."""
        self.stopping = True
        running = [s.proc for s in self.slots if s.proc is not None and s.proc.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGTERM)
        deadline = self._clock() + timeout
        for proc in running:
            try:
                proc.wait(max(0.1, deadline - self._clock()))
            except subprocess.TimeoutExpired:
                log.warning("pid %d did not stop in %.0fs: killed", proc.pid, timeout)
                proc.kill()
                proc.wait(5)

    def pids(self, name: str) -> list[int]:
        return [s.proc.pid for s in self.slots
                if s.name == name and s.proc is not None and s.proc.poll() is None]
