"""`intentroute status` laid out for the width it has (`--json` is not affected):

* WIDE columns or more: the full table, every figure in its own column;
* COMPACT to WIDE: a borderless table of the figures a person watches (replicas, lag,
  redeliveries, dead letters, rate, p95, errors, in flight) under short headers, with a
  line naming them; `handled` and the p95 since start are in the wide table and --json;
* below COMPACT: one block per stage, its figures as `name value` pairs wrapped to the
  width (a vertical layout, readable at 40 columns).

The width is the terminal's; without a terminal, COLUMNS when set (else WIDE): what the
console says (`console_for_status`).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from intentroute.status import StageRow

# The full table needs ~156 columns; the compact one 76.
WIDE = 156
COMPACT = 76


def console_for_status() -> Console:
    """The terminal's width, or COLUMNS without one (rich reads it), else WIDE."""
    import os

    console = Console()
    if console.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return console
    return Console(width=WIDE)


def _cell(value: object, suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}{suffix}"
    return f"{value}{suffix}"


def caption(rows: list[StageRow], interval: float) -> str:
    """What the figures mean, the breakers and each stage's named states (Rich markup)."""
    from intentroute.cli.status_cmd import state_lines

    text = (f"rate and p95 over the last {interval:g} s; p95 (all): since each replica "
            "started; lag: pending = not yet delivered, ack pending = delivered, not yet "
            "acknowledged")
    breakers = {f"{row.stage}/{name}": state for row in rows
                for name, state in row.breakers.items()}
    if breakers:
        text += "\nbreakers: " + escape(", ".join(f"{k} {v}" for k, v in breakers.items()))
    return text + "".join(state_lines(rows))


def _replicas(row: StageRow) -> str:
    idle_backlog = row.replicas == 0 and (row.pending or 0) > 0
    return f"[red]{row.replicas}[/red]" if idle_backlog else str(row.replicas)


def wide_table(rows: list[StageRow], interval: float) -> Table:
    table = Table(title="intentroute status")
    table.add_column("stage", no_wrap=True)
    for header in ("replicas", "pending", "ack pending", "redelivered", "dead letters",
                   "rate/s", "p95 ms", "p95 ms (all)", "handled", "errors", "in flight"):
        table.add_column(header, justify="right")
    for row in rows:
        table.add_row(
            row.stage, _replicas(row), _cell(row.pending), _cell(row.ack_pending),
            _cell(row.redelivered), _cell(row.dead_letters), _cell(row.rate_per_s),
            _cell(row.p95_ms), _cell(row.p95_ms_all), _cell(row.handled),
            _cell(row.errors), _cell(row.inflight))
    table.caption = caption(rows, interval)
    return table


# The compact table's headers: (short header, what it is).
_SHORT = (("repl", "replicas"), ("pend", "pending"), ("ack", "ack pending"),
          ("redel", "redelivered"), ("dlq", "dead letters"), ("rate/s", ""),
          ("p95ms", ""), ("err", "errors"), ("infl", "in flight"))


def compact_table(rows: list[StageRow], interval: float) -> Table:
    table = Table(title="intentroute status", box=None, pad_edge=False, padding=(0, 1),
                  collapse_padding=True,
                  header_style="bold")
    table.add_column("stage", no_wrap=True)
    for header, _ in _SHORT:
        table.add_column(header, justify="right", no_wrap=True, min_width=len(header))
    for row in rows:
        table.add_row(row.stage, _replicas(row), _cell(row.pending), _cell(row.ack_pending),
                      _cell(row.redelivered), _cell(row.dead_letters),
                      _cell(row.rate_per_s), _cell(row.p95_ms), _cell(row.errors),
                      _cell(row.inflight))
    names = ", ".join(f"{short} = {long}" for short, long in _SHORT if long)
    table.caption = f"{names}\n{caption(rows, interval)}"
    table.caption_justify = "left"
    return table


def _pairs(row: StageRow) -> list[tuple[str, str]]:
    return [("replicas", _replicas(row)), ("pending", _cell(row.pending)),
            ("ack pending", _cell(row.ack_pending)), ("redelivered", _cell(row.redelivered)),
            ("dead letters", _cell(row.dead_letters)), ("rate/s", _cell(row.rate_per_s)),
            ("p95 ms", _cell(row.p95_ms)), ("p95 ms (all)", _cell(row.p95_ms_all)),
            ("handled", _cell(row.handled)), ("errors", _cell(row.errors)),
            ("in flight", _cell(row.inflight))]


def vertical(rows: list[StageRow], interval: float, width: int) -> Group:
    """One block per stage: its name, then its figures packed into lines of `width`."""
    parts: list[RenderableType] = [Text("intentroute status", style="bold")]
    for row in rows:
        parts.append(Text(row.stage, style="bold"))
        line: list[str] = []
        used = 2
        for name, value in _pairs(row):
            plain = len(name) + 1 + len(Text.from_markup(value).plain)
            if line and used + 2 + plain > width:
                parts.append(Text.from_markup("  " + "  ".join(line)))
                line, used = [], 2
            line.append(f"[dim]{name}[/dim] {value}")
            used += plain + (2 if len(line) > 1 else 0)
        if line:
            parts.append(Text.from_markup("  " + "  ".join(line)))
    parts.append(Text.from_markup(caption(rows, interval), style="dim"))
    return Group(*parts)


def render_for(rows: list[StageRow], interval: float, width: int) -> Any:
    """The layout that fits `width` columns."""
    if width >= WIDE:
        return wide_table(rows, interval)
    if width >= COMPACT:
        return compact_table(rows, interval)
    return vertical(rows, interval, width)
