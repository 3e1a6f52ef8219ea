"""One `up` per state directory: the lock refuses a second holder, names the first's pid
and writes nothing when it refuses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from intentroute.stack.lock import LOCK_FILE, StackLockedError, StateLock, holder_pid


def test_a_second_holder_is_refused_with_the_first_pid(tmp_path: Path) -> None:
    first = StateLock(tmp_path).acquire()
    try:
        assert holder_pid(tmp_path) == os.getpid()
        before = (tmp_path / LOCK_FILE).stat().st_mtime_ns, (tmp_path / LOCK_FILE).read_bytes()
        with pytest.raises(StackLockedError) as refused:
            StateLock(tmp_path).acquire()
        assert refused.value.pid == os.getpid()
        assert f"pid {os.getpid()}" in str(refused.value)
        after = (tmp_path / LOCK_FILE).stat().st_mtime_ns, (tmp_path / LOCK_FILE).read_bytes()
        assert after == before
    finally:
        first.release()
    assert holder_pid(tmp_path) == 0
    with StateLock(tmp_path):
        assert holder_pid(tmp_path) == os.getpid()


def test_the_lock_goes_with_its_process(tmp_path: Path) -> None:
    """A holder that dies without releasing (kill -9 included) leaves no stale lock."""
    code = ("import sys, os; from pathlib import Path; "
            "from intentroute.stack.lock import StateLock; "
            f"StateLock(Path({str(tmp_path)!r})).acquire(); os._exit(0)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert holder_pid(tmp_path) == 0
    with StateLock(tmp_path):
        pass
