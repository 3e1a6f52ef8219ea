"""`intentroute up`'s ready screen: once every worker answers, a short block saying what
to do next, on stdout (a rich panel on a terminal, plain lines otherwise), and the same
in `stack.json` (`ready`, intentroute.stack.state.ReadyInfo):

* the commands to ask and to add an agent, as this shell can run them;
* the OpenAI-compatible door's base URL with the demo agent's key;
* the gRPC address, when it is on;
* a dashboard link that logs in once (shared.auth.login_links: a random token, good
  for LINK_TTL, exchanged for the session cookie at first use and refused after);
* where the state folder is (what INTENTROUTE_HOME names from another folder), and how
  to stop.

Ready means: every worker type answers the NATS services API (`$SRV.PING`), and the
gateway's HTTP listener says it is ready (`/readyz`). `up` waits for it in a thread of
its own, so supervising the processes goes on meanwhile; with `--demo` the screen comes
after the demo's answers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from intentroute.stack.nats_users import DEMO_AGENT, auth_files
from intentroute.stack.state import STATE_FILE, ReadyInfo, StackInfo, write_state
from intentroute.workers import WORKERS
from shared.auth.login_links import LINK_TTL, LoginLinks
from shared.common.settings import nats_servers

log = logging.getLogger("intentroute.up")

SAMPLE_QUESTION = "How do I loop from 1 to 10 in AVAP?"
LINKS_FOLDER = "dashboard-links"
# How long `up` waits for every worker before it says which did not answer.
READY_TIMEOUT = 300.0


def login_links_dir(state_dir: Path) -> Path:
    """The stack's folder of one-time dashboard login links."""
    return auth_files(state_dir).creds_dir / LINKS_FOLDER


def cli_name(cwd: Path | None = None) -> str:
    """How this shell runs this CLI: `intentroute` when that is the one on PATH, else its
    path (relative to the current folder when under it: `.venv/bin/intentroute`)."""
    own = Path(sys.executable).parent / "intentroute"
    on_path = shutil.which("intentroute")
    if on_path and Path(on_path).resolve() == own.resolve():
        return "intentroute"
    cwd = cwd or Path.cwd()
    try:
        return str(own.relative_to(cwd))
    except ValueError:
        return str(own)


def login_link(dashboard_url: str, state_dir: Path) -> tuple[str, float]:
    """A new one-time login link to the stack's dashboard, and when it expires."""
    token, expires = LoginLinks(login_links_dir(state_dir)).mint()
    return f"{dashboard_url}/login/{token}", expires


def ready_info(info: StackInfo, state_dir: Path, prog: str) -> ReadyInfo:
    """The ready screen's contents for the running stack `info` describes."""
    from shared.auth.natsconn import read_credential

    ready = ReadyInfo(ask=f'{prog} ask "{SAMPLE_QUESTION}"',
                      add_agent=f"{prog} agent add myapp --out myapp.json",
                      stop=f"Ctrl-C here (or kill -TERM {info.pid or os.getpid()})",
                      grpc_address=info.gateway_grpc_address)
    demo = auth_files(state_dir).credential(DEMO_AGENT)
    if info.gateway_http_url:
        ready.openai_base_url = f"{info.gateway_http_url}/v1"
        if demo.exists():
            ready.openai_api_key = read_credential(demo).token
    if info.dashboard_url and login_links_dir(state_dir).is_dir():
        ready.dashboard_login_url, ready.dashboard_login_expires = login_link(
            info.dashboard_url, state_dir)
    return ready


def lines(ready: ReadyInfo, state_dir: Path) -> list[tuple[str, str]]:
    """(label, text) rows of the screen."""
    rows = [("ask", ready.ask), ("add an agent", ready.add_agent)]
    if ready.openai_base_url:
        key = f" api_key={ready.openai_api_key}" if ready.openai_api_key else ""
        rows.append(("OpenAI API", f"base_url={ready.openai_base_url}{key} "
                                   f"model=intentroute"))
    if ready.grpc_address:
        rows.append(("gRPC", ready.grpc_address))
    if ready.dashboard_login_url:
        minutes = round(LINK_TTL / 60)
        rows.append(("dashboard", f"{ready.dashboard_login_url} (logs in once, within "
                                  f"{minutes} min; `intentroute dashboard-link` makes "
                                  f"another)"))
    rows.append(("state", f"{state_dir} (found from this folder and its sub-folders; "
                          f"elsewhere: INTENTROUTE_HOME={state_dir})"))
    rows.append(("stop", ready.stop))
    return rows


def show(ready: ReadyInfo, state_dir: Path, *, terminal: bool | None = None) -> None:
    """The screen on stdout: a panel on a terminal, plain lines otherwise."""
    from rich.console import Console

    console = Console()
    rows = lines(ready, state_dir)
    if terminal if terminal is not None else console.is_terminal:
        from rich.markup import escape
        from rich.panel import Panel
        from rich.table import Table

        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column(overflow="fold")
        for label, text in rows:
            grid.add_row(label, escape(text))
        console.print(Panel(grid, title="intentroute is ready", title_align="left",
                            border_style="green", expand=False))
        return
    out = ["intentroute is ready:", *(f"  {label}: {text}" for label, text in rows)]
    print("\n".join(out), flush=True)


async def _serving(nats_url: str, admin: dict[str, Any], http_url: str,
                   workers: Sequence[str], timeout: float) -> list[str]:
    """Wait until every worker answers `$SRV.PING` and the HTTP listener `/readyz`;
    the ones still silent at `timeout`."""
    import httpx
    import nats

    from shared.auth.permissions import SERVICES_API, service_user

    deadline = time.monotonic() + timeout
    waiting = list(workers)
    nc = await nats.connect(nats_servers(nats_url), **admin)
    try:
        while waiting and time.monotonic() < deadline:
            for worker in list(waiting):
                try:
                    await nc.request(f"{SERVICES_API}.PING.{service_user(worker)}", b"",
                                     timeout=0.5)
                    waiting.remove(worker)
                except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                    pass
            if waiting:
                await asyncio.sleep(0.25)
    finally:
        await nc.drain()
    if http_url and not waiting:
        async with httpx.AsyncClient(timeout=2.0) as http:
            while time.monotonic() < deadline:
                try:
                    if (await http.get(f"{http_url}/readyz")).status_code == 200:
                        return []
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.25)
        return ["the HTTP door (its listener)"]
    return waiting


def announce_when_ready(info: StackInfo, state_dir: Path, nats_url: str,
                        admin: dict[str, Any], *, timeout: float = READY_TIMEOUT
                        ) -> threading.Thread:
    """Wait in a thread until the stack is ready, then write `ready` into stack.json and
    show the screen (module doc)."""
    prog = cli_name()

    def run() -> None:
        try:
            silent = asyncio.run(_serving(nats_url, admin, info.gateway_http_url,
                                          WORKERS, timeout))
        except Exception as exc:  # the bus went away: `up` is stopping or says why
            log.warning("ready screen: could not check the workers: %s", exc)
            return
        if silent:
            log.warning("not ready after %.0f s: %s did not answer (`intentroute status` "
                        "shows each stage)", timeout, ", ".join(silent))
            return
        if not (state_dir / STATE_FILE).exists():  # `up` stopped meanwhile
            return
        info.ready = ready_info(info, state_dir, prog)
        write_state(state_dir, info)
        show(info.ready, state_dir)

    thread = threading.Thread(target=run, name="ready-screen", daemon=True)
    thread.start()
    return thread
