"""`intentroute status` fits the terminal (issue 31): at 80 columns a compact table of
the figures a person watches, below that one block per stage, the full table from 156;
without a terminal COLUMNS decides. Every stage and figure is there at every width and
no line is longer than the width."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from intentroute.cli.status_layout import render_for
from shared.runtime.signals import Lag
from shared.runtime.stage_status import Instance, Sample, stage_rows

REPO = Path(__file__).resolve().parent.parent.parent
STAGES = ("gateway", "classifier", "retriever", "generator-main", "generator-conversational",
          "validator")


def _rows() -> list:  # type: ignore[type-arg]
    inst = Instance(id="a", service="intentroute-classifier", stage="classifier",
                    handled=12345, errors=3, processing_ns=12345 * 1_000_000,
                    states={"backend": "failing: http://127.0.0.1:9/v1 unreachable"})
    sample = Sample(at=1.0, lag={"retriever": Lag(pending=70000, ack_pending=12)},
                    dead_letters={"validator": 4}, instances=[inst])
    return stage_rows(sample, Sample(at=0.0, lag={}, dead_letters={}, instances=[]))


def shown(width: int) -> str:
    console = Console(record=True, width=width, color_system=None)
    console.print(render_for(_rows(), 1.0, width))
    return console.export_text()


@pytest.mark.parametrize("width", [40, 60, 80, 100, 160])
def test_every_stage_fits_the_width(width: int) -> None:
    text = shown(width)
    assert max(len(line) for line in text.splitlines()) <= width, text
    for stage in STAGES:
        assert stage in text, (width, text)
    assert "70000" in text  # the retriever's backlog, whole
    assert "failing: http://127.0.0.1:9/v1 unreachable" in " ".join(text.split())


def test_80_columns_is_one_line_per_stage_with_named_short_headers() -> None:
    text = shown(80)
    (retriever,) = [line for line in text.splitlines() if line.startswith("retriever")]
    assert retriever.split() == ["retriever", "0", "70000", "12", "0", "0", "0.0", "-",
                                 "0", "0"]
    assert text.splitlines()[1].split() == ["stage", "repl", "pend", "ack", "redel", "dlq",
                                            "rate/s", "p95ms", "err", "infl"]
    assert "repl = replicas, pend = pending" in text


def test_60_columns_is_one_block_per_stage() -> None:
    lines = shown(60).splitlines()
    at = lines.index("retriever")
    block = " ".join(lines[at + 1:at + 4])
    assert "pending 70000" in block
    assert "ack pending 12" in block


def _status_width(env: dict[str, str]) -> int:
    """The widest line `intentroute status`'s renderer writes to a pipe with `env`."""
    code = ("from intentroute.cli.status_cmd import console, render\n"
            "from tests.unit.test_status_layout import _rows\n"
            "out = console()\nout.print(render(_rows(), 1.0, out.width))\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=True)
    return max(len(line) for line in done.stdout.splitlines())


def test_without_a_terminal_columns_decides() -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    assert _status_width({**env, "COLUMNS": "60"}) <= 60
    assert _status_width({**env, "COLUMNS": "80"}) <= 80
    assert _status_width(env) > 120  # a log file keeps the full table
