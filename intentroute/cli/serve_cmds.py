"""Commands that run one process or one step of a deployment: `worker`, `migrate`,
`db-init`, `parser`, `llm-server` (the whole stack is `up`, in `stack_cmds`)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated

import typer

from intentroute.cli.apps import app, settings, urls
from intentroute.stack.nats_users import auth_files, service_env
from intentroute.stack.pgroles import stack_worker_url
from intentroute.workers import ALL_WORKERS


@app.command()
def worker(name: Annotated[str, typer.Argument(help=f"One of: {', '.join(ALL_WORKERS)}")]
           ) -> None:
    """Run one worker (for ops: scale a stage by running more of these)."""
    nats_url, db_url = urls()
    cli = settings()
    # The worker builds its settings from the environment: hand it the running stack's,
    # with its service user's credential and its database role when the environment
    # carries none.
    if nats_url:
        os.environ["NATS_URL"] = nats_url
    if db_url:
        os.environ["DATABASE_URL"] = (db_url if cli.database_url else
                                      stack_worker_url(cli.state_dir / "postgres", name, db_url))
    cli = settings()
    if not cli.common.nats_authenticated and name in ALL_WORKERS:
        from shared.auth.permissions import service_user

        if auth_files(cli.state_dir).credential(service_user(name)).exists():
            os.environ.update(service_env(cli.state_dir, name))
    import uvloop

    from shared.runtime.logs import quiet_libraries

    quiet_libraries()  # before the models' libraries are imported (they read it then)
    from intentroute.workers import create_worker

    worker_app = create_worker(name)
    uvloop.run(worker_app.run())


@app.command()
def migrate() -> None:
    """Apply the Alembic migrations to DATABASE_URL: creates or alters the tables, keeps
    their rows (idempotent); then store the limits only the owner may set
    (MAX_SESSIONS_PER_AGENT, REQUEST_LOG_HOT_DAYS: shared.store.owner_settings)."""
    from intentroute.cli.apps import require_db
    from shared.store import migrate as run_migrate
    from shared.store.owner_settings import OwnerSettings

    run_migrate(require_db(), OwnerSettings.of_common(settings().common))


@app.command("db-init")
def db_init(
    passwords: Annotated[Path, typer.Option(
        "--passwords", help="A directory holding one file per role, named after it "
                            "(intentroute_owner, intentroute_gateway, ...), with its password")],
) -> None:
    """As the Postgres superuser (DATABASE_URL, its password in DATABASE_PASSWORD_FILE or
    the URL): create or update the deployment's roles with these passwords and the
    database owned by intentroute_owner, then let only those roles connect. Idempotent;
    run it before `migrate` (compose's db-init job)."""
    from intentroute.cli.apps import OPTIONS, require_db
    from intentroute.cli.reach import check_db
    from intentroute.stack.pgroles import init_database, on_database, read_passwords
    from shared.store.roles import ROLES

    try:
        found = read_passwords(passwords)
    except (OSError, ValueError) as exc:
        typer.echo(f"db-init: {exc}", err=True)
        raise typer.Exit(2) from None
    missing = [role for role in ROLES if role not in found]
    if missing:
        typer.echo(f"db-init: no password file for {', '.join(missing)} in {passwords}",
                   err=True)
        raise typer.Exit(2)
    url = require_db(check=False)  # its database may not exist yet
    check_db(on_database(url, "postgres"), OPTIONS.timeout)
    database = url.rsplit("/", 1)[-1].split("?", 1)[0]
    asyncio.run(init_database(url, database, found))
    typer.echo(f"db-init: roles {', '.join(ROLES)} ready; {database} owned by {ROLES[0]}",
               err=True)


@app.command()
def parser(
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 50051,
    strict: Annotated[bool, typer.Option(help="Strict (spec) mode by default")] = False,
) -> None:
    """Run the AVAP parser gRPC service."""
    from services.parser.server import run

    asyncio.run(run(host, port, default_strict=strict))


@app.command("llm-server")
def llm_server(
    port: Annotated[int, typer.Option()] = 8081,
    threads: Annotated[int | None, typer.Option(
        help="CPU threads for the model (default: all cores but one)")] = None,
) -> None:
    """Serve the local model (SmolLM2-135M, OpenAI-compatible chat API) on 127.0.0.1;
    every call needs OPENAI_API_KEY from the environment as its bearer token."""
    from intentroute.stack.llm import default_threads, serve

    key = settings().openai_api_key
    if not key:
        raise typer.BadParameter("set OPENAI_API_KEY: the model server takes no "
                                 "anonymous calls")
    serve(port, api_key=key, threads=threads or default_threads())
