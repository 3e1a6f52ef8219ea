"""`up --demo`: once the workers are up, one sample question per type, asked as the demo
agent (whose credential the embedded stack writes), else with `up`'s own connection."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import typer

from intentroute.cli.ask_cmd import ask_and_print
from intentroute.settings import CliSettings
from intentroute.stack.nats_users import auth_files
from intentroute.workers import WORKERS, wait_for_consumers
from shared.auth.natsconn import credential_kwargs, read_credential
from shared.common.settings import nats_servers

SAMPLE_QUESTIONS: list[dict[str, str]] = [
    {"query": "What does addParam do in AVAP and in which order does it search the request?"},
    {"query": "Write an AVAP endpoint that reads userId from the request and returns it"},
    {"query": "en menos palabras"},
    {
        "query": "You have a project usage percentage of 20%. Provide an insight in 2 sentences.",
        "extra_context": "project=demo usage_percentage=20 plan=starter monthly_calls=2000 "
        "calls_used=400",
    },
]


def ask_samples(cli: CliSettings, nats_url: str, admin: dict[str, Any]) -> None:
    """The demo: one sample question per type, as the demo agent when it has a credential."""
    asyncio.run(_demo(nats_url, admin, _demo_kwargs(cli) or admin))


def _demo_kwargs(cli: CliSettings) -> dict[str, Any]:
    """The demo agent's connection when the embedded stack wrote its credential."""
    from intentroute.stack.nats_users import DEMO_AGENT

    path = auth_files(cli.state_dir).credential(DEMO_AGENT)
    if cli.nats_url or not path.exists():
        return {}
    return credential_kwargs(read_credential(path), cli.common)


async def _demo(nats_url: str, admin: dict[str, Any], caller: dict[str, Any]) -> None:
    """Wait for the workers (as the admin: consumer info), then ask as the demo agent."""
    import nats

    admin_nc = await nats.connect(nats_servers(nats_url), **admin)
    try:
        typer.echo("waiting for the workers...", err=True)
        await wait_for_consumers(admin_nc, list(WORKERS))
    finally:
        await admin_nc.drain()
    nc = await nats.connect(nats_servers(nats_url), **caller)
    session = f"demo-{uuid.uuid4().hex[:8]}"
    try:
        for sample in SAMPLE_QUESTIONS:
            typer.secho(f"\n> {sample['query']}", bold=True)
            await ask_and_print(nc, agent="demo", session=session, json_lines=False,
                                extra_context=sample.get("extra_context", ""),
                                query=sample["query"])
    finally:
        await nc.drain()
