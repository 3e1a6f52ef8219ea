"""A message that exhausts its deliveries is answered (STAGE_FAILED) and parked in the
dead-letter stream with its stage and reason; `intentroute dlq list` shows it and
`intentroute dlq replay` runs it again."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from intentroute.cli import app
from intentroute.stack.nats_users import admin_kwargs
from services.retriever.embedded import EmbeddedRetrieval
from services.retriever.ports import SearchResult
from shared.client.caller import follow
from shared.contracts.response import response_subject
from tests.helpers.pipeline import ask_all, base_env, make_request, running

pytestmark = pytest.mark.integration


class Broken:
    async def search(self, query: str, k: int) -> SearchResult:
        raise ConnectionError("index unreachable")

    async def maybe_reload(self) -> bool:
        return False

    async def close(self) -> None:
        pass


async def cli(nats_url: str, *args: str) -> Any:
    """The command as an operator runs it (in a thread: it runs its own event loop)."""
    admin = admin_kwargs(Path(base_env("", "", Path())["INTENTROUTE_HOME"]))
    result = await asyncio.to_thread(CliRunner().invoke, app, list(args), env={
        "NATS_URL": nats_url, "NATS_USER": admin["user"], "NATS_PASSWORD": admin["password"]})
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


async def test_exhausted_deliveries_are_answered_dead_lettered_and_replayable(
    nc: Any, nats_url: str, database_url: str, kb_index: Path
) -> None:
    env = base_env(nats_url, database_url, kb_index, STAGE_MAX_DELIVER="2")
    names = ("gateway", "classifier", "retriever", "generator-main")
    req = make_request("what does addVar do?", query_type="RETRIEVAL")
    async with running(env, names, retrievals=[Broken()]):
        failed = await ask_all(nc, req, timeout=30)
    assert len(failed) == 1
    assert failed[0].error is not None
    assert failed[0].error.code == "STAGE_FAILED"

    (letter,) = [d for d in (await cli(nats_url, "dlq", "list", "--json"))["dead_letters"]
                 if d["subject"] == "intentroute.stage.retrieve"
                 and req.request_id in d["payload"]]
    assert letter["stage"] == "retrieve"
    assert letter["deliveries"] == 2
    assert "index unreachable" in letter["reason"]

    working = EmbeddedRetrieval(kb_index, method="bm25", encoder=None)
    async with running(env, ("retriever", "generator-main"), retrievals=[working]):
        sub = await nc.subscribe(response_subject(req.agent_id, req.request_id))
        replayed = await cli(nats_url, "dlq", "replay", str(letter["id"]), "--json")
        chunks = [c async for c in follow(sub, timeout=30)]
        await sub.unsubscribe()
    assert replayed["subject"] == "intentroute.stage.retrieve"
    assert chunks[-1].is_final
    assert chunks[-1].error is None
    assert "addVar" in "".join(c.text for c in chunks)
    remaining = (await cli(nats_url, "dlq", "list", "--json"))["dead_letters"]
    assert letter["id"] not in [d["id"] for d in remaining]
