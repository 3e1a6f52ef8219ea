"""What the embedded servers share: free ports, waiting for a listener, the error type,
and the tie that makes a child die with `intentroute up` (`die_with_parent`)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable


class StackError(RuntimeError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_tcp(host: str, port: int, timeout: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StackError(f"process exited with {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), 0.2):
            return
        time.sleep(0.05)
    raise StackError(f"nothing answered on {host}:{port} within {timeout}s")


def stop_process(proc: subprocess.Popen[bytes] | None, sig: int, timeout: float) -> None:
    if proc and proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()


# prctl(2)'s option "send me this signal when my parent dies" (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int) -> Callable[[], None] | None:
    """A `preexec_fn` for Popen that makes the child get `sig` when this process dies,
    however it dies (kill -9 included: the kernel sends it, nothing of ours has to run).
    `sig` is the child's clean stop: SIGINT for Postgres (fast shutdown), SIGTERM for
    nats-server and the workers (they drain). None (no preexec_fn) where it cannot hold:

    - off Linux (prctl PR_SET_PDEATHSIG is Linux's);
    - off the main thread. The kernel sends the signal when the *thread* that forked the
      child ends, not the process: a server started from an executor thread (tests and
      tools/bench/chaos.py start and restart servers through asyncio.to_thread) would be
      stopped when that thread is retired. `up` spawns every server and worker from its
      main thread (embedded_stack, the keeper's and the supervisor's polls in its loop,
      the drain's tick), which lives as long as the process.

    The setting survives exec (not of a set-user-ID binary) and is cleared by a change
    of user: Popen's `user=` (Postgres as root) switches user before the preexec_fn runs,
    so it holds there too. A parent that dies between the fork and the prctl would send
    nothing: the child checks its parent is still the one that forked it, else exits.

    preexec_fn is unsafe with threads (`up` runs the agents' sync in one) only when the
    function needs a lock another thread may hold at the fork; this one runs a ctypes
    call resolved before the fork and two syscalls: no import, no logging, no lock.
    It costs a fork where Popen would vfork: a spawn from a process of `up`'s size
    (~100 MB resident) took 6.9 ms instead of 0.13 ms (median of 30, load average 9 on
    the 2-core machine), paid once per server or worker start."""
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    prctl = _prctl()
    # prctl is variadic and reads its arguments as unsigned longs: a bare int would leave
    # a register's upper half undefined. Built here, so the child only makes the call.
    args = (ctypes.c_int(_PR_SET_PDEATHSIG), *(ctypes.c_ulong(a) for a in (sig, 0, 0, 0)))
    parent = os.getpid()

    def arm() -> None:  # in the child, between fork and exec
        if prctl(*args) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the parent died before the prctl
            os._exit(1)

    return arm


@functools.cache
def _prctl() -> Callable[..., int]:
    prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    return prctl
