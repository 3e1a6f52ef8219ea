"""`intentroute dashboard-link`: a new one-time login link to the running stack's
dashboard (the ready screen's expires after a few minutes; intentroute.cli.ready)."""

from __future__ import annotations

import typer

from intentroute.cli.apps import app, settings
from intentroute.cli.failure_lines import CliError
from intentroute.cli.ready import login_link, login_links_dir
from intentroute.cli.stack_home import no_stack
from intentroute.stack import read_state
from shared.auth.login_links import LINK_TTL


@app.command("dashboard-link")
def dashboard_link() -> None:
    """Print a one-time login link to the running stack's dashboard: it logs the browser
    that opens it in, once, within 10 minutes, and is refused after; the dashboard token
    never appears in it. Finds the stack as every command does (this folder, its parents,
    INTENTROUTE_HOME). Exit 1 if the stack serves no dashboard."""
    state_dir = settings().state_dir
    info = read_state(state_dir)
    if info is None:
        no_stack()
    if not info.dashboard_url or not login_links_dir(state_dir).is_dir():
        raise CliError("the running stack serves no dashboard with login links (its HTTP "
                       "listener is off, or it runs without `intentroute up`'s dashboard "
                       "token): log in with GATEWAY_DASHBOARD_TOKEN")
    url, _ = login_link(info.dashboard_url, state_dir)
    typer.echo(url)
    typer.echo(f"(logs in once, within {round(LINK_TTL / 60)} min)", err=True)
