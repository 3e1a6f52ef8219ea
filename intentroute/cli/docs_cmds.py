"""`intentroute docs asyncapi`: the AsyncAPI document and JSON Schemas of the messages
(intentroute.docs.asyncapi); `intentroute docs permissions-postgres`: every Postgres
role's privileges on a live server (intentroute.docs.pg_permissions); `intentroute docs
permissions-nats`: what every NATS user may publish and subscribe to, probed on a live
server (intentroute.docs.nats_permissions); written or checked."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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
