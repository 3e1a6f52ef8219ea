"""A child started with `die_with_parent(sig)` gets `sig` when its parent is killed with
SIGKILL (real processes: a parent that starts a child, then is killed); off the main
thread nothing is armed (the kernel would signal the child when that thread ends)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from intentroute.stack.procs import die_with_parent
from testkit.procs import process_gone

# The child writes the signal it got into `got`, then exits; `ready` once its handler is
# installed.
CHILD = """
import signal, sys, time
from pathlib import Path
got, ready = Path(sys.argv[1]), Path(sys.argv[2])
def on(sig, _frame):
    got.write_text(str(sig))
    sys.exit(0)
for s in (signal.SIGTERM, signal.SIGINT):
    signal.signal(s, on)
ready.write_text("")
time.sleep(60)
"""

# The parent starts the child as `up` starts its servers (a session of its own), prints
# its pid, then waits to be killed.
PARENT = """
import subprocess, sys, time
from intentroute.stack.procs import die_with_parent
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]],
                         start_new_session=True, preexec_fn=die_with_parent(int(sys.argv[4])))
print(child.pid, flush=True)
time.sleep(60)
"""




def _until(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_child_gets_its_stop_signal_when_its_parent_is_killed(
        tmp_path: Path, sig: signal.Signals) -> None:
    got, ready = tmp_path / "got", tmp_path / "ready"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD, str(got), str(ready), str(int(sig))],
        stdout=subprocess.PIPE, text=True)
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _until(ready.exists, 30)
        parent.kill()
        parent.wait(10)
        assert _until(lambda: process_gone(child), 10)
        assert got.read_text() == str(int(sig))
    finally:
        parent.kill()
        if child and not process_gone(child):
            os.kill(child, signal.SIGKILL)


def test_nothing_is_armed_off_the_main_thread() -> None:
    found: list[object] = []
    thread = threading.Thread(target=lambda: found.append(die_with_parent(signal.SIGTERM)))
    thread.start()
    thread.join()
    assert found == [None]
    if sys.platform.startswith("linux"):
        assert callable(die_with_parent(signal.SIGTERM))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_a_child_armed_in_the_main_thread_starts_and_runs_normally() -> None:
    done = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True,
                          text=True, preexec_fn=die_with_parent(signal.SIGTERM), check=True)
    assert done.stdout == "ran\n"
