"""`intentroute agent add|list|revoke`: the agents that may call the bus.

They work on DATABASE_URL or the running `intentroute up`'s database; with a running
embedded stack a change reaches nats-server at once (its auth part is rewritten and
reloaded), without one it does when the next `up` starts.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from intentroute.cli.apps import app, require_db, settings
from shared.store.agents import AgentError, AgentRecord, AgentStore

agent_app = typer.Typer(no_args_is_help=True, help="Agents: credentials to call the bus.")
app.add_typer(agent_app, name="agent")

T = TypeVar("T")


def _with_store(db_url: str, action: Callable[[AgentStore], Awaitable[T]]) -> T:
    async def run() -> T:
        store = await AgentStore.connect(db_url)
        try:
            return await action(store)
        finally:
            await store.close()

    try:
        return asyncio.run(run())
    except AgentError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None


def _reload_running_stack(db_url: str) -> None:
    """Apply the change to a running embedded stack's nats-server now."""
    from intentroute.stack import read_state
    from intentroute.stack.auth import sync_agents

    cli = settings()
    state = read_state(cli.state_dir)
    if state is None or not state.nats_pid or state.database_url != db_url:
        typer.echo("no running embedded stack on this database: NATS learns of the change "
                   "when `intentroute up` starts", err=True)
        return
    asyncio.run(sync_agents(cli.state_dir, db_url, pid=state.nats_pid))


@agent_app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="Agent id: 1-64 of A-Z a-z 0-9 _ -")],
    trusted: Annotated[
        bool, typer.Option(help="May declare query_type; its RC-01 prefix is honoured")
    ] = False,
    out: Annotated[
        Path | None, typer.Option(help="Write the credential to this file (mode 0600)")
    ] = None,
) -> None:
    """Create an agent and print its credential (JSON); the secret is not shown again."""
    import msgspec

    from shared.natsconn import write_credential

    db_url = require_db()
    cred = _with_store(db_url, lambda store: store.add(name, trusted=trusted))
    _reload_running_stack(db_url)
    if out is not None:
        write_credential(out, cred)
        typer.echo(f"agent {name} added; credential written to {out}", err=True)
    else:
        typer.echo(msgspec.json.encode(cred).decode())


@agent_app.command("list")
def list_agents(json_out: Annotated[bool, typer.Option("--json")] = False) -> None:
    """The agents: id, trusted, created, revoked."""
    records = _with_store(require_db(), lambda store: store.list())
    if json_out:
        typer.echo(json.dumps([_row(r) for r in records]))
        return
    rows = [("AGENT", "TRUSTED", "CREATED", "REVOKED")]
    rows += [(r.agent_id, "yes" if r.trusted else "no", _when(r.created_at),
              _when(r.revoked_at)) for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@agent_app.command("revoke")
def revoke(name: Annotated[str, typer.Argument(help="Agent id")]) -> None:
    """Revoke an agent: its connections are closed and its credential refused."""
    db_url = require_db()
    record = _with_store(db_url, lambda store: store.revoke(name))
    _reload_running_stack(db_url)
    typer.echo(f"agent {record.agent_id} revoked at {_when(record.revoked_at)}", err=True)


def _row(record: AgentRecord) -> dict[str, object]:
    return {
        "agent_id": record.agent_id,
        "trusted": record.trusted,
        "created_at": record.created_at.isoformat(),
        "revoked_at": record.revoked_at.isoformat() if record.revoked_at else None,
    }


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S%z") if value else "-"
