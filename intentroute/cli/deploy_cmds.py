"""`intentroute deploy ...`: what a deployment beyond `intentroute up` runs once: its
secrets (`init`), its streams (`streams`), its agents' NATS users (`nats-auth`), and the
Kubernetes manifests (`k8s`). docs/guides/deploy/compose.md
and kubernetes.md."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from intentroute.cli.apps import deploy_app, require_db, settings

DEFAULT_SECRETS = Path("secrets")
# Where the committed manifests live (relative to the repository root, the usual cwd).
DEFAULT_K8S = Path("deploy/k8s")


@deploy_app.command("init")
def init(
    folder: Annotated[Path, typer.Option(
        "--dir", help="Where to write the secrets (compose.yml reads ./secrets)")
    ] = DEFAULT_SECRETS,
    nodes: Annotated[int, typer.Option(
        min=1, help="NATS servers: nats-1..nats-N, joined as a cluster when N > 1")] = 3,
) -> None:
    """Write the deployment's secrets: every NATS user's credential, the servers' configs
    with the users' permissions, the admission key, one password per Postgres role and
    the dashboard token. Keeps every secret already there (rerun it freely)."""
    from intentroute.deploy.secrets import init_secrets

    made = init_secrets(folder, nodes=nodes)
    typer.echo(f"deploy init: secrets in {made.root} (NATS users and {nodes} server "
               f"config(s) in {made.auth.nats_dir}); keep the directory private", err=True)


@deploy_app.command("streams")
def streams(
    creds: Annotated[Path | None, typer.Option(
        "--creds", help="The admin's credential file (else the NATS_* settings)")] = None,
) -> None:
    """Declare or update the streams on NATS_URL as the admin (workers may only check
    that they exist), with NATS_STREAM_REPLICAS replicas and the STREAM_* limits."""
    import nats

    from shared.auth.natsconn import connect_kwargs, credential_kwargs, read_credential
    from shared.runtime.streams import ensure_streams

    cli = settings()
    common = cli.common
    if not cli.nats_url:
        typer.echo("deploy streams: set NATS_URL (the servers to declare them on)", err=True)
        raise typer.Exit(2)
    try:
        kwargs = (credential_kwargs(read_credential(creds), common) if creds
                  else connect_kwargs(common))
    except OSError as exc:
        typer.echo(f"deploy streams: --creds: {exc.strerror}: {exc.filename}", err=True)
        raise typer.Exit(2) from None

    async def run() -> None:
        nc = await nats.connect(common.nats_servers, **kwargs)
        try:
            await ensure_streams(nc.jetstream(), common.response_ttl, common.replicas(),
                                 limits=common.streams)
        finally:
            await nc.drain()

    asyncio.run(run())
    typer.echo(f"deploy streams: declared with {common.replicas()} replica(s)", err=True)


@deploy_app.command("nats-auth")
def nats_auth(
    folder: Annotated[Path, typer.Option(
        "--dir", help="The secrets directory `deploy init` wrote")] = DEFAULT_SECRETS,
) -> None:
    """Render the servers' auth.conf with every active agent of DATABASE_URL as a NATS
    user (agents that speak NATS directly); then reload the servers (SIGHUP: `docker
    compose kill -s HUP nats-1 nats-2 nats-3`), twice a second apart when agents were
    added: nats-server wires a new account's service imports only on the reload after
    the one that created it. The doors need no reload."""
    from intentroute.deploy.secrets import DeploySecrets, render_agents
    from shared.store.agents import AgentStore

    files = DeploySecrets(folder).auth
    if not files.hashes.is_file():
        typer.echo(f"deploy nats-auth: {files.hashes} is missing; run `intentroute deploy "
                   f"init --dir {folder}` first", err=True)
        raise typer.Exit(2)
    db_url = require_db()

    async def agents() -> list[tuple[str, str]]:
        store = await AgentStore.connect(db_url)
        try:
            return await store.active_hashes()
        finally:
            await store.close()

    active = asyncio.run(agents())
    reloads = render_agents(folder, active)
    then = {0: ", unchanged", 1: "; reload the NATS servers (SIGHUP)",
            2: "; reload the NATS servers twice, a second apart (SIGHUP, or `nats-server "
               "--signal reload`): a new agent's account gets its service imports only on "
               "the second reload"}[reloads]
    typer.echo(f"deploy nats-auth: {len(active)} agent(s) in {files.auth}{then}", err=True)


@deploy_app.command("k8s")
def k8s(
    out: Annotated[Path, typer.Option(
        "--out", help="Directory for the manifests and kustomization.yaml")] = DEFAULT_K8S,
    check: Annotated[bool, typer.Option(
        "--check", help="Write nothing; exit 1 if DIR differs from what would be written")
    ] = False,
    secrets_dir: Annotated[Path | None, typer.Option(
        "--secrets", help="Also write secrets.yaml from this `deploy init` directory")
    ] = None,
    values: Annotated[list[str] | None, typer.Option(
        "--set", help="key=value: image, nats_url, nats_monitoring, postgres, database, "
                      "superuser, ollama_host, es_url, stream_replicas, max_replicas")] = None,
) -> None:
    """Render the Kubernetes manifests: a Deployment per worker type and model slot, the
    parser, jobs (db-init + migrate, streams, ingest) and KEDA ScaledObjects scaling each
    stage on its JetStream consumer lag."""
    from intentroute.deploy.k8s import options_from, render, write
    from intentroute.rendered import folder_differences

    pairs = [v.partition("=") for v in values or []]
    bad = [key for key, sep, _ in pairs if not sep]
    try:
        if bad:
            raise ValueError(f"expected key=value, got {', '.join(bad)}")
        options = options_from({key: value for key, _, value in pairs})
    except ValueError as exc:
        typer.echo(f"deploy k8s: --set: {exc}", err=True)
        raise typer.Exit(2) from None
    if check:
        wrong = folder_differences(render(options), out)
        if wrong:
            typer.echo(f"{out}: {', '.join(wrong)} out of date; run `intentroute deploy k8s "
                       f"--out {out}`", err=True)
            raise typer.Exit(1)
        typer.echo(f"{out}: up to date")
        return
    if secrets_dir is not None and not (secrets_dir / "creds").is_dir():
        typer.echo(f"deploy k8s: --secrets {secrets_dir}: no secrets there; run `intentroute "
                   f"deploy init --dir {secrets_dir}` first", err=True)
        raise typer.Exit(2)
    written = write(out, options, secrets_dir)
    typer.echo(f"wrote {len(written)} files in {out}")
