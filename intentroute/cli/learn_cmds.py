"""`intentroute learn`: run the learning job once; `learn propose` / `learn proposals`:
an operator's proposal (checked like the job's own) and the proposals' history."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import typer

from intentroute.cli.apps import app, emit, require_db

learn_app = typer.Typer(
    help="The learning job (ADR-0006): per-agent proposals, observe mode, A/B, promotion. "
         "`intentroute learn` alone runs it once and prints a JSON summary (a proposal it "
         "promotes changes that agent's policy); exit 1 if a phase failed.")
app.add_typer(learn_app, name="learn")


@learn_app.callback(invoke_without_command=True)
def learn(
    ctx: typer.Context,
    json_out: Annotated[bool, typer.Option(
        "--json", help="Accepted for symmetry: the summary is always JSON")] = False,
) -> None:
    """Run the learning job once (unless another run holds its lock) and print a JSON
    summary: what each phase did and how long it took. It may change agents' policies
    (proposals promoted after A/B). Exit 1 if a phase failed."""
    if ctx.invoked_subcommand is not None:
        return
    from shared.learning.job import learn_once
    from shared.learning.settings import LearnSettings

    summary = asyncio.run(learn_once(require_db(), LearnSettings.from_env()))
    typer.echo(json.dumps(summary, default=str))
    if summary["ran"] and not summary["ok"]:
        raise typer.Exit(1)


@learn_app.command("propose")
def propose(
    agent: Annotated[str, typer.Argument(help="Agent id")],
    assignment: Annotated[str, typer.Argument(
        help="clarity_threshold=0.6 or fallback.main=MODEL,...,extractive|error")],
) -> None:
    """Queue a proposal: the next run replays it in observe mode, then A/B, then
    promotes or rejects it, as it does its own."""
    from shared.learning.job import utc_now
    from shared.learning.proposals import insert, parse_assignment
    from shared.policy.agent import PolicyError

    try:
        key, value = parse_assignment(assignment)
    except PolicyError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    db_url = require_db()

    async def run() -> int:
        import asyncpg

        from shared.store import asyncpg_dsn
        from shared.store.policies import load_policy

        conn = await asyncpg.connect(asyncpg_dsn(db_url))
        try:
            policy = await load_policy(conn, agent)
            baseline = (policy.clarity_threshold if key == "clarity_threshold"
                        else policy.fallback.get(key.partition(".")[2]))
            return await insert(conn, agent_id=agent, key=key, value=value, baseline=baseline,
                                figures={}, origin="operator", now=utc_now())
        finally:
            await conn.close()

    proposal_id = asyncio.run(run())
    typer.echo(json.dumps({"id": proposal_id, "agent_id": agent, "key": key, "value": value,
                           "status": "observe"}))


@learn_app.command("proposals")
def proposals(
    agent: Annotated[str | None, typer.Option(help="Only this agent's")] = None,
    limit: Annotated[int, typer.Option(help="Most recent first")] = 50,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object on stdout")] = False,
) -> None:
    """Proposals, newest first: status, evidence (fit, observe, A/B figures), reason;
    changes nothing."""
    import msgspec

    from shared.learning.proposals import listing

    db_url = require_db()

    async def run() -> list[Any]:
        import asyncpg

        from shared.store import asyncpg_dsn

        conn = await asyncpg.connect(asyncpg_dsn(db_url))
        try:
            return await listing(conn, agent, limit)
        finally:
            await conn.close()

    rows = [msgspec.to_builtins(p) for p in asyncio.run(run())]
    emit({"proposals": rows}, json_out)
