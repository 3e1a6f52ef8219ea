"""`stack.json`: how other commands find a running `intentroute up`."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec


class StackInfo(msgspec.Struct):
    nats_url: str
    database_url: str
    parser_url: str = ""
    pid: int = 0
    # With auth on: the nats-server's config (its auth part is regenerated when agents
    # change) and its pid (signalled to reload it).
    nats_config: str = ""
    nats_pid: int = 0


STATE_FILE = "stack.json"


def write_state(state_dir: Path, info: StackInfo) -> None:
    """stack.json carries the database password: readable by its owner only."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / STATE_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(msgspec.json.encode(info))
    path.chmod(0o600)


def read_state(state_dir: Path) -> StackInfo | None:
    path = state_dir / STATE_FILE
    if not path.exists():
        return None
    info = msgspec.json.decode(path.read_bytes(), type=StackInfo)
    if info.pid and not pid_alive(info.pid):
        return None
    return info


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True
