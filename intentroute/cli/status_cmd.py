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
from intentroute.cli.status_layout import WIDE, console_for_status, render_for
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


def render(rows: list[StageRow], interval: float, width: int = WIDE) -> Any:
    """The status as it fits `width` columns (intentroute.cli.status_layout)."""
    return render_for(rows, interval, width)


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
    """The terminal's width, or COLUMNS without one, else a wide table."""
    return console_for_status()


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
            out = console()
            out.print(render(rows, interval, out.width))

    async def _watch(nc: Any, current: Any, previous: Any) -> None:
        step = interval if interval > 0 else 2.0
        if json_out:  # one JSON line per refresh
            while True:
                show(stage_rows(current, previous))
                await asyncio.sleep(step)
                previous, current = current, await read_sample(nc, timeout=timeout)
        from rich.live import Live

        out = console()
        with Live(render(stage_rows(current, previous), step, out.width), auto_refresh=False,
                  console=out) as live:
            while True:
                await asyncio.sleep(step)
                previous, current = current, await read_sample(nc, timeout=timeout)
                live.update(render(stage_rows(current, previous), step, out.width),
                            refresh=True)

    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends --watch
        asyncio.run(run())
