"""`intentroute docs asyncapi`: the AsyncAPI document and JSON Schemas of the messages
(intentroute.docs.asyncapi); `intentroute docs permissions-postgres`: every Postgres
role's privileges on a live server (intentroute.docs.pg_permissions); `intentroute docs
permissions-nats`: what every NATS user may publish and subscribe to, probed on a live
server (intentroute.docs.nats_permissions); the site's generated reference pages:
`config` (the settings declarations), `cli` (the commands), `subjects` (the AsyncAPI
document), `metrics` (the instruments) and `diagrams` (SVG); each written or checked."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from intentroute.cli.apps import docs_app

# Where the committed copy lives (relative to the repository root, the usual cwd).
DEFAULT_OUT = Path("docs/asyncapi")


@docs_app.command("asyncapi")
def asyncapi(
    out: Annotated[Path, typer.Option(
        "--out", help="Directory for asyncapi.json and schemas/*.json.")] = DEFAULT_OUT,
    check: Annotated[bool, typer.Option(
        "--check", help="Write nothing; exit 1 if DIR differs from what would be written.")
    ] = False,
) -> None:
    """Write the AsyncAPI 3.0 document of every subject and one JSON Schema per message,
    generated from the contracts (byte-identical on every run)."""
    from intentroute.docs.asyncapi import ASYNCAPI_FILE, SCHEMAS_DIR, SCHEMAS_GLOB, render, write
    from intentroute.rendered import folder_differences

    if check:
        # Sorted: a stale schema named among the changed ones.
        wrong = sorted(folder_differences(render(), out, owned=SCHEMAS_GLOB))
        if wrong:
            typer.echo(f"{out}: {', '.join(wrong)} out of date; run `intentroute docs "
                       f"asyncapi --out {out}`", err=True)
            raise typer.Exit(1)
        typer.echo(f"{out}: up to date")
        return
    if out.exists() and not out.is_dir():
        typer.echo(f"--out {out}: not a directory", err=True)
        raise typer.Exit(2)
    written = write(out)
    typer.echo(f"wrote {out / ASYNCAPI_FILE} and {len(written) - 1} JSON Schemas in "
               f"{out / SCHEMAS_DIR}")


@docs_app.command("permissions-postgres")
def permissions_postgres(
    out: Annotated[Path | None, typer.Option(
        "--out", help="The Markdown file (default docs/reference/permissions-postgres.md)."),
    ] = None,
    check: Annotated[bool, typer.Option(
        "--check", help="Write nothing; exit 1 if FILE differs from what would be written.")
    ] = False,
) -> None:
    """Write the table of every Postgres role's privileges (tables, columns, sequences,
    functions and which run as SECURITY DEFINER, the database, schemas, role attributes
    and memberships), read from a throwaway embedded Postgres deployed as `up` deploys
    it: the superuser's init, then every migration as the owner."""
    from intentroute.docs.pg_permissions import DEFAULT_OUT as PERMISSIONS_OUT
    from intentroute.docs.pg_permissions import generate

    path = out or PERMISSIONS_OUT
    if path.is_dir():
        typer.echo(f"--out {path}: a directory", err=True)
        raise typer.Exit(2)
    text = generate()
    if check:
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            typer.echo(f"{path}: out of date; run `intentroute docs permissions-postgres "
                       f"--out {path}`", err=True)
            raise typer.Exit(1)
        typer.echo(f"{path}: up to date")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    typer.echo(f"wrote {path}")


@docs_app.command("permissions-nats")
def permissions_nats(
    out: Annotated[Path | None, typer.Option(
        "--out", help="The Markdown file (default docs/reference/permissions-nats.md)."),
    ] = None,
    check: Annotated[bool, typer.Option(
        "--check", help="Write nothing; exit 1 if FILE differs from what would be written.")
    ] = False,
) -> None:
    """Write the table of what every NATS user (admin, ops reader, each worker's service
    user, an agent) may publish and subscribe to, probed on a throwaway embedded
    nats-server configured as `up` configures it (with two agents): every subject of the
    contracts, the JetStream API of each stream and consumer, the services API and the
    inboxes, published and subscribed to as each user; plus each user's account and
    allow_responses bound, read from the rendered config."""
    from intentroute.docs.nats_permissions import DEFAULT_OUT as PERMISSIONS_OUT
    from intentroute.docs.nats_permissions import generate

    path = out or PERMISSIONS_OUT
    if path.is_dir():
        typer.echo(f"--out {path}: a directory", err=True)
        raise typer.Exit(2)
    text = generate()
    if check:
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            typer.echo(f"{path}: out of date; run `intentroute docs permissions-nats "
                       f"--out {path}`", err=True)
            raise typer.Exit(1)
        typer.echo(f"{path}: up to date")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    typer.echo(f"wrote {path}")


def _page(command: str, out: Path | None, default: Path, check: bool, render: Any) -> None:
    """Write one generated page, or with --check compare it (exit 1 when it differs)."""
    from intentroute.docs.markdown import write_or_check

    path = out or default
    if path.is_dir():
        typer.echo(f"--out {path}: a directory", err=True)
        raise typer.Exit(2)
    code, line = write_or_check(path, render(), command, check=check)
    typer.echo(line, err=code != 0)
    if code:
        raise typer.Exit(code)


OUT_HELP = "The Markdown file (default {})."
CHECK_HELP = "Write nothing; exit 1 if FILE differs from what would be written."


@docs_app.command("config")
def config(
    out: Annotated[Path | None, typer.Option(
        "--out", help=OUT_HELP.format("docs/reference/configuration.md"))] = None,
    check: Annotated[bool, typer.Option("--check", help=CHECK_HELP)] = False,
) -> None:
    """Write the configuration reference: every environment variable the code reads, its
    default, the form its value takes and what it does, from the settings declarations
    (the comment above each field)."""
    from intentroute.docs import configuration

    _page("config", out, configuration.DEFAULT_OUT, check, configuration.render)


@docs_app.command("cli")
def cli(
    out: Annotated[Path | None, typer.Option(
        "--out", help=OUT_HELP.format("docs/reference/cli.md"))] = None,
    check: Annotated[bool, typer.Option("--check", help=CHECK_HELP)] = False,
) -> None:
    """Write the CLI reference: every command with its arguments, options and help, from
    the commands themselves (what each `--help` prints, on one page)."""
    from intentroute.docs import cli_reference

    _page("cli", out, cli_reference.DEFAULT_OUT, check, cli_reference.render)


@docs_app.command("subjects")
def subjects(
    out: Annotated[Path | None, typer.Option(
        "--out", help=OUT_HELP.format("docs/reference/subjects.md"))] = None,
    check: Annotated[bool, typer.Option("--check", help=CHECK_HELP)] = False,
) -> None:
    """Write the subjects and messages page: the AsyncAPI document (`docs asyncapi`)
    rendered as Markdown: operations, channels with their streams and consumers, each
    message's headers, fields and examples, the types."""
    from intentroute.docs import subjects as page
    from intentroute.docs.asyncapi import document

    _page("subjects", out, page.DEFAULT_OUT, check, lambda: page.render(document()))


@docs_app.command("metrics")
def metrics(
    out: Annotated[Path | None, typer.Option(
        "--out", help=OUT_HELP.format("docs/reference/metrics.md"))] = None,
    check: Annotated[bool, typer.Option("--check", help=CHECK_HELP)] = False,
) -> None:
    """Write the metrics reference: every metric a worker exports (Prometheus name, type,
    labels, OpenTelemetry instrument, unit), read from the instruments themselves."""
    from intentroute.docs import metrics_reference

    _page("metrics", out, metrics_reference.DEFAULT_OUT, check, metrics_reference.render)


@docs_app.command("diagrams")
def diagrams(
    out: Annotated[Path, typer.Option(
        "--out", help="Directory for the SVG files (default docs/diagrams).")
    ] = Path("docs/diagrams"),
    check: Annotated[bool, typer.Option(
        "--check", help="Write nothing; exit 1 if DIR differs from what would be written.")
    ] = False,
) -> None:
    """Write the architecture diagrams as SVG, drawn from the components and arrows
    declared in intentroute/docs/diagrams.py (no script, no web font: they render
    offline)."""
    from intentroute.docs.diagrams import render
    from intentroute.rendered import folder_differences

    drawn = render()
    if check:
        wrong = folder_differences(drawn, out, owned="*.svg")
        if wrong:
            typer.echo(f"{out}: {', '.join(wrong)} out of date; run `intentroute docs "
                       f"diagrams --out {out}`", err=True)
            raise typer.Exit(1)
        typer.echo(f"{out}: up to date")
        return
    if out.exists() and not out.is_dir():
        typer.echo(f"--out {out}: not a directory", err=True)
        raise typer.Exit(2)
    out.mkdir(parents=True, exist_ok=True)
    for stale in folder_differences(drawn, out, owned="*.svg"):
        if stale not in drawn:
            (out / stale).unlink()
    for name, content in drawn.items():
        (out / name).write_text(content, encoding="utf-8")
    typer.echo(f"wrote {len(drawn)} diagrams in {out}")
