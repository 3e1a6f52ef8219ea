"""Process checks the tests and benchmarks that kill processes share."""

from __future__ import annotations

from pathlib import Path


def process_gone(pid: int) -> bool:
    """Exited: no such process, or a zombie its parent (or new parent) has not reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")
