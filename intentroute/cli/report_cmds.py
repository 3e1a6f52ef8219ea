"""`intentroute report costs|slo` and `intentroute retention`: accounting from the daily
rollups (shared/accounting/), on DATABASE_URL or the running `intentroute up`'s database.

Reports first recompute the window's rollups from the request log (days still in its
hot window; `--no-refresh` reads them as the learning job last left them)."""

from __future__ import annotations

import asyncio
import csv
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from intentroute.cli.apps import app, emit, require_db, settings

if TYPE_CHECKING:
    import asyncpg

    from shared.accounting.costs import CostReport, ModelCost
    from shared.policy.agent import AgentPolicy

report_app = typer.Typer(no_args_is_help=True,
                         help="Accounting reports from the daily rollups (UTC days).")
app.add_typer(report_app, name="report")

T = TypeVar("T")

JsonFlag = Annotated[bool, typer.Option("--json", help="One JSON object on stdout")]
SinceOpt = Annotated[str, typer.Option(help="First UTC day, YYYY-MM-DD (default: 29 days "
                                            "before --until)")]
UntilOpt = Annotated[str, typer.Option(help="Last UTC day, YYYY-MM-DD, included "
                                            "(default: today)")]
HashFlag = Annotated[bool, typer.Option(
    "--hash-agents", help="Replace agent ids with HMAC-SHA256 under the key of "
                          "AGENT_HASH_KEY_FILE / AGENT_HASH_KEY / --hash-key-file")]
HashKeyFile = Annotated[Path | None, typer.Option(
    help="File holding the agent hash key (implies --hash-agents)")]
RefreshFlag = Annotated[bool, typer.Option(
    "--refresh/--no-refresh", help="Recompute the window's rollups from the log first")]


def _window(since: str, until: str) -> tuple[date, date]:
    try:
        last = date.fromisoformat(until) if until else datetime.now(UTC).date()
        first = date.fromisoformat(since) if since else last - timedelta(days=29)
    except ValueError as exc:
        typer.echo(f"bad day: {exc} (expected YYYY-MM-DD)", err=True)
        raise typer.Exit(2) from None
    if first > last:
        typer.echo("--since is after --until", err=True)
        raise typer.Exit(2)
    return first, last


def _namer(hash_agents: bool, key_file: Path | None) -> Callable[[str], str] | None:
    from shared.accounting.hashing import HashKeyError, agent_hasher, load_key

    if not (hash_agents or key_file):
        return None
    cli = settings()
    path = key_file or (Path(cli.agent_hash_key_file) if cli.agent_hash_key_file else None)
    try:
        return agent_hasher(load_key(key_file=path, env_key=cli.agent_hash_key))
    except HashKeyError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None


def _on_db(action: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    import asyncpg

    from shared.store import asyncpg_dsn

    db_url = require_db()

    async def run() -> T:
        conn = await asyncpg.connect(asyncpg_dsn(db_url))
        try:
            return await action(conn)
        finally:
            await conn.close()

    return asyncio.run(run())


async def _refreshed(conn: asyncpg.Connection, first: date, last: date,
                     refresh: bool) -> dict[str, AgentPolicy]:
    """The agents' policies, after refreshing the rollups of `first` .. `last` (with
    their prices; days already dropped from the log are left as they are)."""
    from shared.accounting.rollups import prices_of, refresh_rollups
    from shared.store.policies import load_policies

    policies = await load_policies(conn)
    today = datetime.now(UTC).date()
    if refresh and first <= today:
        await refresh_rollups(conn, first, min(last, today), prices_of(policies))
    return policies


@report_app.command("costs")
def report_costs(
    since: SinceOpt = "",
    until: UntilOpt = "",
    json_out: JsonFlag = False,
    csv_out: Annotated[bool, typer.Option("--csv", help="CSV on stdout, one line per "
                                                        "agent and model")] = False,
    main_model: Annotated[str, typer.Option(
        help="The main slot's model the saving is priced against (default: "
             "OLLAMA_MODEL_NAME)")] = "",
    hash_agents: HashFlag = False,
    hash_key_file: HashKeyFile = None,
    refresh: RefreshFlag = True,
) -> None:
    """Tokens * price + compute seconds per agent and model, the saving against sending
    everything to the main slot's model, requests refused at admission by code (never
    billed), and days above the agent's mean + 2 sd. Changes nothing but the window's
    rollups, recomputed from the log (unless --no-refresh)."""
    from shared.accounting.costs import (
        CSV_COLUMNS,
        TRAILING_DAYS,
        anomaly_line,
        cost_report,
        csv_rows,
    )
    from shared.accounting.hashing import identity
    from shared.accounting.rollups import prices_of

    if json_out and csv_out:
        typer.echo("--json and --csv exclude each other", err=True)
        raise typer.Exit(2)
    first, last = _window(since, until)
    name = _namer(hash_agents, hash_key_file) or identity
    model = main_model or settings().main_model

    async def build(conn: asyncpg.Connection) -> CostReport:
        # The anomaly rule also reads the days before the window.
        policies = await _refreshed(conn, first - timedelta(days=TRAILING_DAYS), last, refresh)
        currencies = {agent: p.currency for agent, p in policies.items() if p.currency}
        return await cost_report(conn, first, last, prices=prices_of(policies),
                                 main_model=model, name=name, currencies=currencies)

    report = _on_db(build)
    if json_out:
        emit(report, True)
        return
    if csv_out:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        writer.writerows(csv_rows(report))
        for anomaly in report.anomalies:
            typer.echo(anomaly_line(anomaly), err=True)
        return
    _print_costs(report)


def _print_costs(report: CostReport) -> None:
    from shared.accounting.costs import anomaly_line, refused_text

    typer.echo(f"costs {report.since} .. {report.until} (UTC days); main slot model: "
               f"{report.main_model or '(not set)'}; REFUSED: refused at admission, by "
               "code (among REQUESTS, never billed)")
    header = ("AGENT", "MODEL", "REQUESTS", "REFUSED", "TOKENS_IN", "TOKENS_OUT",
              "COMPUTE_S", "COST", "MAIN_SLOT_COST", "SAVING")
    rows = [header]
    for agent in report.agents:
        unit = f" {agent.currency}" if agent.currency else ""
        rows.append((agent.agent_id, "*", str(agent.requests), refused_text(agent.refused),
                     str(agent.tokens_in), str(agent.tokens_out), f"{agent.compute_s:.1f}",
                     f"{agent.cost:.4f}{unit}", _money(agent.main_slot_cost, unit),
                     _money(agent.saving, unit)))
        rows += [("", m.model or "-", str(m.requests), "", str(m.tokens_in),
                  str(m.tokens_out), f"{m.compute_s:.1f}",
                  f"{m.cost:.4f}{unit}" + _unpriced(m), "", "") for m in agent.models]
    t = report.totals
    currencies = list(t.cost_by_currency)
    unit = f" {currencies[0]}" if len(currencies) == 1 and currencies[0] else ""
    mixed = len(currencies) > 1
    rows.append(("TOTAL", "", str(t.requests), refused_text(t.refused), str(t.tokens_in),
                 str(t.tokens_out), f"{t.compute_s:.1f}",
                 "mixed" if mixed else f"{t.cost:.4f}{unit}",
                 "mixed" if mixed else _money(t.main_slot_cost, unit),
                 "mixed" if mixed else _money(t.saving, unit)))
    _table(rows)
    if mixed:
        typer.echo("TOTAL by currency: " + ", ".join(
            f"{cost:.4f} {currency or 'units'}" for currency, cost in t.cost_by_currency.items()))
    for anomaly in report.anomalies:
        typer.echo(anomaly_line(anomaly))


@report_app.command("slo")
def report_slo(
    since: SinceOpt = "",
    until: UntilOpt = "",
    json_out: JsonFlag = False,
    hash_agents: HashFlag = False,
    hash_key_file: HashKeyFile = None,
    refresh: RefreshFlag = True,
) -> None:
    """Per agent and day: p50/p95/p99 of the total time; days over the agent's
    slo_p95_ms flagged (`intentroute agent set NAME slo_p95_ms=...`)."""
    from shared.accounting.hashing import identity
    from shared.accounting.slo import SloReport, breach_line, slo_report

    first, last = _window(since, until)
    name = _namer(hash_agents, hash_key_file) or identity

    async def build(conn: asyncpg.Connection) -> SloReport:
        policies = await _refreshed(conn, first, last, refresh)
        return await slo_report(conn, first, last, policies=policies, name=name)

    report = _on_db(build)
    if json_out:
        emit(report, True)
        return
    typer.echo(f"latency (total ms) {report.since} .. {report.until} (UTC days)")
    rows = [("AGENT", "SLO_P95", "REQUESTS", "P50", "P95", "P99", "WORST_DAY_P95",
             "BREACH_DAYS")]
    rows += [(a.agent_id, _ms(a.slo_p95_ms), str(a.requests), _ms(a.p50_ms), _ms(a.p95_ms),
              _ms(a.p99_ms), _ms(a.worst_day_p95_ms), str(a.breach_days))
             for a in report.agents]
    _table(rows)
    for agent in report.agents:
        for day in agent.days:
            if day.breach:
                typer.echo(breach_line(agent, day))


@app.command()
def retention(
    json_out: JsonFlag = False,
    hot_days: Annotated[int | None, typer.Option(
        help="Days of request log kept (default REQUEST_LOG_HOT_DAYS, 30)")] = None,
    rollup_days: Annotated[int | None, typer.Option(
        help="Days of rollups kept (default ROLLUP_KEEP_DAYS, 365)")] = None,
) -> None:
    """Request-log partitions: create the coming days', drop those past the hot window
    (after a last rollup); delete rollups past their year. The learning job runs the
    same."""
    from shared.accounting.retention import apply_retention

    common = settings().common
    hot = hot_days if hot_days is not None else common.log_hot_days
    keep = rollup_days if rollup_days is not None else common.rollup_keep_days
    if hot < 1 or keep < 1:
        typer.echo("--hot-days and --rollup-days must be >= 1", err=True)
        raise typer.Exit(2)

    async def run(conn: asyncpg.Connection) -> dict[str, object]:
        return await apply_retention(conn, datetime.now(UTC), hot, keep)

    emit(_on_db(run), json_out)


def _unpriced(model: ModelCost) -> str:
    used = model.tokens_in or model.tokens_out or model.compute_s
    return " (no price)" if used and not model.priced else ""


def _money(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.4f}{unit}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
