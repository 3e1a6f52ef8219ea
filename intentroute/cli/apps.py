"""The Typer apps the command modules register on, and what several commands share."""

from __future__ import annotations

import typer

from intentroute.settings import CliSettings
from intentroute.stack import read_state

app = typer.Typer(
    no_args_is_help=True, add_completion=False,
    help="intentroute: run the stack, one worker, ask, ingest, evaluations and benchmarks.",
)
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks (JSON with --json).")
app.add_typer(bench_app, name="bench")
eval_app = typer.Typer(no_args_is_help=True, help="Evaluations (JSON with --json).")
app.add_typer(eval_app, name="eval")


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"intentroute {version('intentroute')}")
        raise typer.Exit()


@app.callback()
def _main(
    show_version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True,
        help="Print the version and exit."),
) -> None:
    """intentroute: run the stack, one worker, ask, ingest, evaluations and benchmarks."""


def settings() -> CliSettings:
    return CliSettings.from_env()


def urls(cli: CliSettings | None = None) -> tuple[str, str]:
    """NATS / Postgres URLs from the environment, else from a running `intentroute up`."""
    cli = cli or settings()
    nats_url, db_url = cli.nats_url, cli.database_url
    if db_url and cli.database_password_file:
        from pathlib import Path

        from intentroute.stack.pgroles import with_password

        try:
            password = Path(cli.database_password_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            typer.echo(f"DATABASE_PASSWORD_FILE: {exc.strerror}: {exc.filename}", err=True)
            raise typer.Exit(2) from None
        db_url = with_password(db_url, password)
    if not (nats_url and db_url):
        state = read_state(cli.state_dir)
        if state:
            nats_url = nats_url or state.nats_url
            db_url = db_url or state.database_url
    return nats_url, db_url


def operator_kwargs(cli: CliSettings | None = None) -> dict[str, object]:
    """`nats.connect` kwargs of an operator command: the running embedded stack's admin,
    or the NATS_* settings (an external server)."""
    from intentroute.stack.auth import admin_kwargs, auth_files
    from shared.auth.natsconn import connect_kwargs, tls_kwargs
    from shared.auth.permissions import ADMIN_USER

    cli = cli or settings()
    if not cli.nats_url and auth_files(cli.state_dir).credential(ADMIN_USER).exists():
        return {**admin_kwargs(cli.state_dir), **tls_kwargs(cli.common)}
    return dict(connect_kwargs(cli.common))


def require_db() -> str:
    _, db_url = urls()
    if not db_url:
        typer.echo("DATABASE_URL is not set and no `intentroute up` is running", err=True)
        raise typer.Exit(2)
    return db_url


def emit(report: object, json_out: bool) -> None:
    """A report as one JSON object (--json) or as an indented, human-readable listing."""
    import json

    import msgspec

    data = report if isinstance(report, dict) else msgspec.to_builtins(report)
    if json_out:
        typer.echo(json.dumps(data))
        return
    _print_tree(data, 0)


def _print_tree(value: object, depth: int) -> None:
    pad = "  " * depth
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, dict | list) and item and not _flat_list(item):
                typer.echo(f"{pad}{key}:")
                _print_tree(item, depth + 1)
            else:
                typer.echo(f"{pad}{key}: {_scalar(item)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict | list):
                typer.echo(f"{pad}-")
                _print_tree(item, depth + 1)
            else:
                typer.echo(f"{pad}- {_scalar(item)}")
    else:
        typer.echo(f"{pad}{_scalar(value)}")


def _flat_list(value: object) -> bool:
    return isinstance(value, list) and all(not isinstance(v, dict | list) for v in value)


def _scalar(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return ", ".join(_scalar(v) for v in value)
    return str(value)
