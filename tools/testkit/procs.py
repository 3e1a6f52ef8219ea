"""Processes for the tests and benchmarks: a stand-in child process for the code that
supervises children (`FakeProc`), and a check on real ones they kill (`process_gone`)."""

from __future__ import annotations

import itertools
import signal
from pathlib import Path

_PIDS = itertools.count(1000)


class FakeProc:
    """A child process as `subprocess.Popen` shows it (`pid`, `returncode`, `poll`,
    `send_signal`, `kill`, `wait`). A signal ends it (return code -signal) unless it is
    `stubborn`: then only `kill` does. `signals` records the signals it was sent;
    `events`, which several processes may share, records "SIGTERM name" / "SIGKILL name"
    in the order they came. A test ends it by setting `returncode`."""

    def __init__(self, name: str = "", events: list[str] | None = None, *,
                 stubborn: bool = False, pid: int | None = None) -> None:
        self.name = name
        self.events = [] if events is None else events
        self.stubborn = stubborn
        self.pid = next(_PIDS) if pid is None else pid
        self.returncode: int | None = None
        self.signals: list[int] = []

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        self.events.append(f"{signal.Signals(sig).name} {self.name}")
        if not self.stubborn:
            self.returncode = -sig

    def kill(self) -> None:
        self.events.append(f"SIGKILL {self.name}")
        self.returncode = -signal.SIGKILL

    def wait(self, timeout: float | None = None) -> int:
        assert self.returncode is not None
        return self.returncode


def process_gone(pid: int) -> bool:
    """Exited: no such process, or a zombie its parent (or new parent) has not reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")
