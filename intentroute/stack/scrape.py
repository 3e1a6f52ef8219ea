"""The Prometheus scrape targets of `up`'s workers: the port each process serves its
metrics on, and the `file_sd_configs` file naming them (pure but for the file write)."""

from __future__ import annotations

import json
from pathlib import Path

METRICS_TARGETS = "metrics_targets.json"


def metrics_ports(counts: dict[str, int], base: int) -> list[tuple[str, int]]:
    """(worker, port) per worker process, in start order: each process of `up` serves
    its metrics on the next port from `base` (0: none)."""
    if not base:
        return []
    names = [name for name, count in counts.items() for _ in range(count)]
    return [(name, base + i) for i, name in enumerate(names)]


def write_targets(path: Path, ports: list[tuple[str, int]], host: str) -> None:
    """The scrape targets as a Prometheus `file_sd_configs` file (a restarted worker
    keeps its port, so the file stays true while `up` runs)."""
    scrape_host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
    groups = [{"targets": [f"{scrape_host}:{port}"], "labels": {"worker": name}}
              for name, port in ports]
    path.write_text(json.dumps(groups, indent=2) + "\n", encoding="utf-8")
