"""The Typer apps the command modules register on, and what several commands share.

`app` is invoked as a `Cli`: an exception that ends a command becomes one line on stderr
and an exit code (intentroute.cli.failure_lines), a traceback only with `--debug`; a bad flag or
argument is one line too (`OneLineUsage`), exit 2."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import typer
from typer.core import TyperGroup

from intentroute.cli.failure_lines import USAGE, describe
from intentroute.cli.reach import check_db
from intentroute.settings import CliSettings
from intentroute.stack import read_state

# `intentroute --timeout`'s default: seconds to reach NATS / Postgres (a local server
# answers in milliseconds, a remote one with TLS in well under a second).
REACH_TIMEOUT = 5.0


@dataclass
class Invocation:
    """The root options of this run of the CLI (one per process)."""

    debug: bool = False
    timeout: float = REACH_TIMEOUT


OPTIONS = Invocation()


class Cli(typer.Typer):
    """The root app: a command's failure is one line and an exit code, not a traceback
    (unless --debug or INTENTROUTE_DEBUG=1)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except Exception as exc:
            if OPTIONS.debug:
                raise
            code, line = describe(exc)
            print(" ".join(line.splitlines()), file=sys.stderr)
            raise SystemExit(code) from None


class OneLineUsage(TyperGroup):
    """The root command group: a bad flag, a missing argument, a bad value or an unknown
    command is one line on stderr naming where the usage is shown, exit 2 (Typer prints
    the usage and a boxed message, 7 lines). `--help` and a bare group's help (no
    arguments) are unchanged. Typer bundles its own click (`typer._click`): its usage
    errors are caught here, where the root command parses its options (`make_context`)
    and where every subcommand parses its own (`invoke`)."""

    def make_context(self, info_name: str | None, args: list[str],
                     parent: Any = None, **extra: Any) -> Any:
        with _one_line_usage():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: Any) -> Any:
        with _one_line_usage():
            return super().invoke(ctx)


@contextmanager
def _one_line_usage() -> Iterator[None]:
    from typer._click.exceptions import NoSuchOption, UsageError

    try:
        yield
    except UsageError as exc:
        # No arguments to a group: its help is what Typer shows, as it should.
        if type(exc).__name__ == "NoArgsIsHelpError":
            raise
        where = exc.ctx.command_path if exc.ctx is not None else "intentroute"
        shows = "the options" if isinstance(exc, NoSuchOption) else "the usage"
        message = " ".join(exc.format_message().split()).rstrip(".")
        typer.echo(f"{message} ({where} --help shows {shows})", err=True)
        raise typer.Exit(USAGE) from None


app = Cli(
    cls=OneLineUsage, no_args_is_help=True, add_completion=False,
    help="intentroute: run the stack, one worker, ask, ingest, evaluations and benchmarks. "
         "Exit codes: 0 done, 1 refused or failed (a server away or refusing, an unknown "
         "id), 2 usage (a bad flag, file or setting).",
)
docs_app = typer.Typer(no_args_is_help=True, help="Documents generated from the code.")
app.add_typer(docs_app, name="docs")
deploy_app = typer.Typer(no_args_is_help=True,
                         help="Deployments beyond `up`: secrets, streams, Kubernetes manifests.")
app.add_typer(deploy_app, name="deploy")


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
    debug: bool = typer.Option(
        False, "--debug", envvar="INTENTROUTE_DEBUG",
        help="Show the traceback of a failure instead of its one line."),
    timeout: float = typer.Option(
        REACH_TIMEOUT, "--timeout", min=0.1,
        help="Seconds to reach NATS / Postgres before giving up (ask, status, agent, dlq, "
             "report, learn)."),
) -> None:
    """intentroute: run the stack, one worker, ask, ingest, evaluations and benchmarks."""
    OPTIONS.debug, OPTIONS.timeout = debug, timeout


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
    from intentroute.stack.nats_users import admin_kwargs, auth_files
    from shared.auth.natsconn import connect_kwargs, tls_kwargs
    from shared.auth.permissions import ADMIN_USER

    cli = cli or settings()
    if not cli.nats_url and auth_files(cli.state_dir).credential(ADMIN_USER).exists():
        return {**admin_kwargs(cli.state_dir), **tls_kwargs(cli.common)}
    return dict(connect_kwargs(cli.common))


def require_db(*, check: bool = True) -> str:
    """The database URL, once Postgres there took a login within `--timeout` (unless not
    `check`: the caller checks what it connects to itself)."""
    _, db_url = urls()
    if not db_url:
        from intentroute.cli.stack_home import no_stack

        no_stack()
    if check:
        check_db(db_url, OPTIONS.timeout)
    return db_url


@contextmanager
def stack_errors() -> Iterator[None]:
    """A local model that is not installed (or does not start) is one line on stderr
    and exit status 1."""
    from intentroute.stack import StackError

    try:
        yield
    except StackError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None


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
