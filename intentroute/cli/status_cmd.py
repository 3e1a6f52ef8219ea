"""`intentroute status`: each stage's replicas, lag, rate and p95 (intentroute.status)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Annotated, Any

import typer

from intentroute.cli.apps import OPTIONS, app, settings, urls
from intentroute.cli.reach import connect_nats
from intentroute.cli.stack_home import no_stack
from intentroute.status import StageRow, read_sample, report, stage_rows


def status_kwargs() -> dict[str, Any]:
    """The monitoring reader's connection: the running embedded stack's `intentroute-ops`
    credential, else the NATS_* settings (an external server: give it an ops user)."""
    from intentroute.stack.nats_users import auth_files, ops_kwargs
    from shared.auth.natsconn import connect_kwargs, tls_kwargs
    from shared.auth.permissions import OPS_USER

    cli = settings()
    if not cli.nats_url and auth_files(cli.state_dir).credential(OPS_USER).exists():
        return {**ops_kwargs(cli.state_dir), **tls_kwargs(cli.common)}
    return dict(connect_kwargs(cli.common))


def _cell(value: object, suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}{suffix}"
    return f"{value}{suffix}"


def render(rows: list[StageRow], interval: float) -> Any:
    from rich.table import Table

    caption = (f"rate and p95 over the last {interval:g} s; p95 (all): since each replica "
               "started; lag: pending = not yet delivered, ack pending = delivered, not yet "
               "acknowledged")
    table = Table(title="intentroute status")
    table.add_column("stage", no_wrap=True)
    for header in ("replicas", "pending", "ack pending", "redelivered", "dead letters",
                   "rate/s", "p95 ms", "p95 ms (all)", "handled", "errors", "in flight"):
        table.add_column(header, justify="right")
    for row in rows:
        idle_backlog = row.replicas == 0 and (row.pending or 0) > 0
        table.add_row(
            row.stage, f"[red]{row.replicas}[/red]" if idle_backlog else str(row.replicas),
            _cell(row.pending), _cell(row.ack_pending), _cell(row.redelivered),
            _cell(row.dead_letters), _cell(row.rate_per_s), _cell(row.p95_ms),
            _cell(row.p95_ms_all), _cell(row.handled), _cell(row.errors), _cell(row.inflight))
    breakers = {f"{row.stage}/{name}": state for row in rows
                for name, state in row.breakers.items()}
    if breakers:
        caption += "\nbreakers: " + ", ".join(f"{k} {v}" for k, v in breakers.items())
    table.caption = caption + "".join(state_lines(rows))
    return table


def state_lines(rows: list[StageRow]) -> list[str]:
    """A line per stage and named state (the generator's model backend), as Rich markup:
    red when failing."""
    from rich.markup import escape

    lines = []
    for row in rows:
        for name, line in row.states.items():
            text = escape(f"{row.stage} {name}: {line}")
            failing = line.startswith("failing")
            lines.append("\n" + (f"[red]{text}[/red]" if failing else text))
    return lines


def console() -> Any:
    """A terminal's width, or a wide table when the output is not a terminal."""
    from rich.console import Console

    out = Console()
    return out if out.is_terminal else Console(width=160)


@app.command()
def status(
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object (per refresh)")]
    = False,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option(
        help="Seconds between the two readings rates and p95 are taken over "
             "(0: one reading, no rate)")] = 1.0,
    timeout: Annotated[float, typer.Option(
        help="Seconds to wait for the replicas' replies (reaching NATS: `intentroute "
             "--timeout`)")] = 1.0,
) -> None:
    """Each stage's replicas (services API), lag (pending / ack pending), redeliveries, dead
    letters, rate and p95, and each generator's model backend (ok, failing: why), from
    the running stack (or NATS_URL with an ops user). Reads
    only; exit 1 if NATS cannot be reached within `intentroute --timeout`."""
    nats_url, _ = urls()
    if not nats_url:
        no_stack()
    kwargs = status_kwargs()

    async def run() -> None:
        nc = await connect_nats(nats_url, kwargs, timeout=OPTIONS.timeout)
        try:
            previous = None
            if interval > 0:
                previous = await read_sample(nc, timeout=timeout)
                await asyncio.sleep(interval)
            current = await read_sample(nc, timeout=timeout)
            if not watch:
                show(stage_rows(current, previous))
                return
            await _watch(nc, current, previous)
        finally:
            await nc.drain()

    def show(rows: list[StageRow]) -> None:
        if json_out:
            typer.echo(json.dumps(report(rows, interval)))
        else:
            console().print(render(rows, interval))

    async def _watch(nc: Any, current: Any, previous: Any) -> None:
        step = interval if interval > 0 else 2.0
        if json_out:  # one JSON line per refresh
            while True:
                show(stage_rows(current, previous))
                await asyncio.sleep(step)
                previous, current = current, await read_sample(nc, timeout=timeout)
        from rich.live import Live

        with Live(render(stage_rows(current, previous), step), auto_refresh=False,
                  console=console()) as live:
            while True:
                await asyncio.sleep(step)
                previous, current = current, await read_sample(nc, timeout=timeout)
                live.update(render(stage_rows(current, previous), step), refresh=True)

    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends --watch
        asyncio.run(run())
