"""`intentroute agent add|list|revoke|set|show`: the agents that may call the bus, and
their per-agent policies.

They work on DATABASE_URL or the running `intentroute up`'s database; with a running
embedded stack a change of agents reaches nats-server at once (its auth part is
rewritten and reloaded), without one it does when the next `up` starts. A policy change
(`agent set`) is read by running workers at their next refresh (`POLICY_REFRESH`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, TypeVar

import asyncpg
import typer

from intentroute.cli.apps import app, require_db, settings, urls
from intentroute.stack.nats_users import ReloadRefusedError
from shared.auth.exports import CredentialFormat
from shared.policy.agent import AgentPolicy, PolicyError, encode_policy
from shared.store import asyncpg_dsn
from shared.store.agents import AgentError, AgentRecord, AgentStore, UnknownAgentError
from shared.store.policies import UnknownPolicyAgentError, show_policy, update_policy

agent_app = typer.Typer(no_args_is_help=True, help="Agents: credentials to call the bus.")
app.add_typer(agent_app, name="agent")

T = TypeVar("T")
# The way out of an unknown agent id.
_UNKNOWN = ": `intentroute agent list` shows the agents"


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
        typer.echo(f"{exc}{_UNKNOWN if isinstance(exc, UnknownAgentError) else ''}", err=True)
        raise typer.Exit(1) from None


# Why a change did not reach the running nats-server: it refused the reload (or did not
# confirm it), or none of the stack's servers is running (ProcessLookupError).
NOT_APPLIED: tuple[type[Exception], ...] = (ReloadRefusedError, ProcessLookupError)


def _reload_running_stack(db_url: str) -> None:
    """Apply the change to a running embedded stack's nats-server now, and wait for the
    server to say it did: raises one of NOT_APPLIED when it did not. The servers are
    found by their current processes (their pid files), not by a pid `stack.json` may
    remember from before a restart."""
    from intentroute.stack import read_state
    from intentroute.stack.nats_users import sync_agents

    cli = settings()
    state = read_state(cli.state_dir)
    if state is None or not (state.nats_config or state.nats_pid) or state.database_url != db_url:
        typer.echo("no running embedded stack on this database: NATS learns of the change "
                   "when `intentroute up` starts", err=True)
        return
    asyncio.run(sync_agents(cli.state_dir, db_url, force=True))


def _undo_add(db_url: str, name: str, out: Path | None) -> None:
    """An added agent whose credential is not in effect: its row and file go (a rerun
    adds it afresh), and the auth part is rendered without it again."""
    from intentroute.stack.nats_users import sync_agents

    _with_store(db_url, lambda store: store.discard(name))
    if out is not None:
        out.unlink(missing_ok=True)
    with contextlib.suppress(Exception):  # the server refuses again: it never had it
        asyncio.run(sync_agents(settings().state_dir, db_url))


@agent_app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="Agent id: 1-64 of A-Z a-z 0-9 _ -")],
    trusted: Annotated[
        bool, typer.Option(help="May declare query_type; its RC-01 prefix is honoured")
    ] = False,
    out: Annotated[
        Path | None, typer.Option(help="Write the credential to this file (mode 0600)")
    ] = None,
    form: Annotated[CredentialFormat, typer.Option(
        "--format", help="json: the credential file; nats-context: the NATS CLI's context "
                         "(save it as ~/.config/nats/context/NAME.json); env: NATS_URL, "
                         "NATS_USER, NATS_PASSWORD, NATS_INBOX_PREFIX lines")
    ] = CredentialFormat.JSON,
) -> None:
    """Create an agent and print its credential (JSON, or --format's); the secret is not
    shown again. It names the NATS server(s) (NATS_URL, else the running `up`'s) and with
    TLS the CA (NATS_TLS_CA). Exit 1 if the agent exists already."""
    import msgspec

    from shared.auth.exports import render
    from shared.auth.natsconn import with_server, write_secret

    db_url = require_db()
    nats_url, ca = urls()[0], settings().common.nats_tls_ca
    cred = _with_store(db_url, lambda store: store.add(name, trusted=trusted))
    try:
        cred = with_server(cred, nats_url, ca) if nats_url else cred
        if out is not None:  # first: an agent never lacks its credential file
            write_secret(out, render(cred, form).encode())
        _reload_running_stack(db_url)
    except (ReloadRefusedError, OSError) as exc:  # OSError: ProcessLookupError too
        _undo_add(db_url, name, out)
        typer.echo(f"agent add: {name} not added: {exc}", err=True)
        raise typer.Exit(1) from None
    if out is not None:
        typer.echo(f"agent {name} added; credential written to {out}", err=True)
    elif form is CredentialFormat.JSON:
        typer.echo(msgspec.json.encode(cred).decode())
    else:
        typer.echo(render(cred, form), nl=False)


@agent_app.command("export")
def export(
    credential: Annotated[Path, typer.Argument(
        help="An agent's credential file (`agent add --out`; `up`'s demo agent: "
             ".intentroute/creds/demo.json)")],
    form: Annotated[CredentialFormat, typer.Option(
        "--format", help="nats-context, env or json (as `agent add --format`)")
    ] = CredentialFormat.NATS_CONTEXT,
    out: Annotated[
        Path | None, typer.Option(help="Write it to this file (mode 0600)")
    ] = None,
) -> None:
    """Print an agent's credential file in another client's form; changes nothing. A file
    that names no server gets NATS_URL's (else the running `up`'s)."""
    import msgspec

    from intentroute.cli.failure_lines import UsageError
    from shared.auth.exports import render
    from shared.auth.natsconn import read_credential, with_server, write_secret

    try:
        cred = read_credential(credential)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise UsageError(f"{credential}: not an agent credential ({exc}): `intentroute "
                         "agent add NAME --out FILE` writes one") from None
    nats_url = "" if cred.url else urls()[0]
    if nats_url:
        cred = with_server(cred, nats_url, settings().common.nats_tls_ca)
    if out is None:
        typer.echo(render(cred, form), nl=False)
    else:
        write_secret(out, render(cred, form).encode())


@agent_app.command("list")
def list_agents(json_out: Annotated[bool, typer.Option("--json")] = False) -> None:
    """The agents: id, trusted, created, revoked; changes nothing."""
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
    """Revoke an agent: its connections are closed and its credential refused (kept in
    the database as revoked). Exit 1 for an unknown agent."""
    db_url = require_db()
    record = _with_store(db_url, lambda store: store.revoke(name))
    try:
        _reload_running_stack(db_url)
    except NOT_APPLIED as exc:
        # Not undone: a revocation is kept; `up`'s auth sync reloads again every ~2 s.
        typer.echo(f"agent revoke: {name} is revoked in the database but NATS still admits "
                   f"it: {exc}", err=True)
        raise typer.Exit(1) from None
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


def _policy_action(
    action: Callable[[asyncpg.Pool], Awaitable[AgentPolicy]],
) -> AgentPolicy:
    db_url = require_db()

    async def run() -> AgentPolicy:
        pool = await asyncpg.create_pool(asyncpg_dsn(db_url), min_size=1, max_size=1)
        try:
            return await action(pool)
        finally:
            await pool.close()

    try:
        return asyncio.run(run())
    except PolicyError as exc:
        unknown = isinstance(exc, UnknownPolicyAgentError)
        typer.echo(f"{exc}{_UNKNOWN if unknown else ''}", err=True)
        raise typer.Exit(1) from None


@agent_app.command("set")
def set_policy(
    name: Annotated[str, typer.Argument(help="Agent id")],
    assignments: Annotated[list[str], typer.Argument(
        help="key=value ...: clarity_threshold, clarity_policy, fallback.SLOT, slo_p95_ms, "
             "price.MODEL, rate (20/s), burst, max_inflight, tokens_per_min, budget_day, "
             "budget_month, on_budget (refuse|degrade), weight, cache (on|off), cache_ttl "
             "(1h), cache_group (an empty value unsets a key; `off` turns a limit off)")],
) -> None:
    """Change an agent's policy and print the result (JSON); running workers pick it up
    within POLICY_REFRESH seconds. Nothing changes if one assignment is refused."""
    policy = _policy_action(lambda pool: update_policy(pool, name, assignments))
    typer.echo(encode_policy(policy))


@agent_app.command("show")
def show(name: Annotated[str, typer.Argument(help="Agent id")]) -> None:
    """An agent's policy as JSON (`{}`: the global defaults), then on stderr each model
    slot's chain as a request walks it; changes nothing."""
    policy = _policy_action(lambda pool: show_policy(pool, name))
    typer.echo(encode_policy(policy))
    for line in walked_chains(policy):
        typer.echo(line, err=True)


def walked_chains(policy: AgentPolicy) -> list[str]:
    """Each slot's chain as it will be walked, with the latency targets that time it:
    the slot's model from this environment's fleet (LLM_FLEET or the seed variables)."""
    from shared.llm.select import open_fleet
    from shared.policy.chain import build_chain, describe_chain

    common = settings().common
    try:
        fleet = open_fleet(common)
    except ValueError:
        fleet = None
    ttft = policy.ttft_ms if policy.ttft_ms is not None else common.llm_ttft_ms
    stall = policy.stall_ms if policy.stall_ms is not None else common.llm_stall_ms
    lines = []
    for slot in ("main", "conversational"):
        model = fleet.slot_model(slot) if fleet is not None else "slot/<the slot's model>"
        steps = build_chain(model, policy.fallback.get(slot))
        lines.append(f"{slot}:")
        lines += [f"  {line}" for line in describe_chain(steps, ttft_ms=ttft,
                                                          stall_ms=stall)]
    return lines
