"""What `intentroute status` reads and how it turns two readings into a table: the
reading and the rows are `shared.runtime.stage_status` (the doors' dashboard shows
the same rows); this module adds the `--json` report."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from shared.runtime.stage_status import (
    Instance,
    Sample,
    StageRow,
    gather,
    parse_stats,
    read_sample,
    stage_rows,
)

__all__ = ["Instance", "Sample", "StageRow", "gather", "parse_stats", "read_sample", "report",
           "stage_rows"]


def report(rows: Sequence[StageRow], interval: float) -> dict[str, Any]:
    """`intentroute status --json`."""
    return {"interval_s": interval, "stages": [msgspec.to_builtins(r) for r in rows]}
