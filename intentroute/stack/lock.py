"""One `intentroute up` per state directory: an exclusive flock on `<state>/up.lock`,
held for the life of the process (the kernel releases it when the process ends, however
it ends, so a crashed `up` leaves no stale lock behind).

The holder writes its pid into the file, so a second `up` can say whose stack runs
there without touching any of its files. fcntl directly rather than the `filelock`
package: its Unix lock opens the file with O_TRUNC on every attempt, which would erase
the holder's pid each time a second `up` tried.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

LOCK_FILE = "up.lock"


class StackLockedError(RuntimeError):
    """Another process holds the state directory; `pid` is its pid (0: not known yet)."""

    def __init__(self, state_dir: Path, pid: int) -> None:
        self.state_dir = state_dir
        self.pid = pid
        who = f"pid {pid}" if pid else "pid not written yet"
        super().__init__(f"a stack is already running from {state_dir} ({who}); stop it "
                         "first, or point INTENTROUTE_HOME at another directory")


class StateLock:
    """The state directory's lock, acquired without waiting (`acquire`), released on
    `release` or when the process exits."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.path = state_dir / LOCK_FILE
        self._fd = -1

    def acquire(self) -> StateLock:
        """Take the lock and write our pid, or raise StackLockedError naming the holder's.
        A refused attempt only opens the file for reading the pid: it writes nothing."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # O_CLOEXEC (Python's default): the servers and workers `up` starts do not
        # inherit the lock, so it goes with `up` itself.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise StackLockedError(self.state_dir, pid) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the last descriptor releases the flock
            self._fd = -1

    def __enter__(self) -> StateLock:
        return self.acquire()

    def __exit__(self, *_: object) -> None:
        self.release()


def _read_pid(fd: int) -> int:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0)
    except (OSError, ValueError):
        return 0


def holder_pid(state_dir: Path) -> int:
    """The pid of the `up` holding this state directory, 0 when none does."""
    path = state_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return 0
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_pid(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return 0
    finally:
        os.close(fd)
