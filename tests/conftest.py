"""Fixtures: real NATS (JetStream) and PostgreSQL for the whole session.

INTENTROUTE_TEST_NATS_URL / INTENTROUTE_TEST_DATABASE_URL point the tests at
running servers; otherwise embedded ones are started on free ports (the same
code path as `intentroute up`).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"

# Short redelivery so the crash tests do not wait 30 s; set before any worker starts.
os.environ.setdefault("STAGE_ACK_WAIT", "3")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The embedded stack with authentication on, as `intentroute up` runs it; its state
    dir becomes INTENTROUTE_HOME, where workers find their service credentials."""
    from intentroute.stack import embedded_stack
    from shared.store import migrate

    external = os.environ.get("INTENTROUTE_TEST_NATS_URL", "")
    state_dir = tmp_path_factory.mktemp("stack")
    with embedded_stack(
        state_dir,
        nats_url=external,
        database_url=os.environ.get("INTENTROUTE_TEST_DATABASE_URL", ""),
        auth=not external,
    ) as (nats_url, database_url):
        migrate(database_url)
        if not external:  # the admin declares the streams, as `intentroute up` does
            import asyncio

            from intentroute.stack.nats_users import admin_kwargs
            from tests.helpers.nats_auth import declare_streams

            asyncio.run(declare_streams(nats_url, admin_kwargs(state_dir)))
        os.environ["INTENTROUTE_HOME"] = str(state_dir)
        yield nats_url, database_url


@pytest.fixture(scope="session")
def nats_url(stack: tuple[str, str]) -> str:
    return stack[0]


@pytest.fixture(scope="session")
def database_url(stack: tuple[str, str]) -> str:
    return stack[1]


@pytest.fixture(scope="session")
async def agents(stack: tuple[str, str]) -> dict[str, Any]:
    """The test agents (tests/helpers/agents.py), added as `intentroute agent add`
    adds them; agent id -> its credential."""
    from tests.helpers.agents import add_test_agents

    return await add_test_agents(*stack)


@pytest.fixture(scope="session")
def agent_tokens(agents: dict[str, Any]) -> dict[str, str]:
    """Agent id -> its bearer token (gRPC, HTTP)."""
    return {agent: cred.token for agent, cred in agents.items()}


@pytest.fixture
async def connect_as(nats_url: str, agents: dict[str, Any]) -> AsyncIterator[Any]:
    """`await connect_as(agent_id)`: a NATS connection with that agent's credential."""
    from tests.helpers.agents import Connections

    connect = Connections(nats_url, agents)
    yield connect
    await connect.close()


@pytest.fixture
async def admin_nc(nats_url: str) -> AsyncIterator[Any]:
    """A connection as the stack's admin (streams and consumers of its own), as
    operator commands connect."""
    import nats

    home = Path(os.environ.get("INTENTROUTE_HOME", ""))
    kwargs: dict[str, Any] = {}
    if (home / "creds").is_dir():
        from intentroute.stack.nats_users import admin_kwargs

        kwargs = admin_kwargs(home)
    client = await nats.connect(nats_url, **kwargs)
    yield client
    await client.drain()


@pytest.fixture
async def nc(connect_as: Any) -> Any:
    """A connection as the (trusted) test agent `tests`."""
    return await connect_as("tests")


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[object]:
    from shared.store.stores import Store

    s = await Store.connect(database_url)
    yield s
    await s.close()


@pytest.fixture
async def fake_ollama() -> AsyncIterator[object]:
    from tests.helpers.fake_ollama import FakeOllama

    server = await FakeOllama().start()
    yield server
    await server.stop()


@pytest.fixture(scope="session")
def kb_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo knowledge base ingested once with the real encoder."""
    from services.retriever.indexing.embedded_ingest import ingest
    from shared.encoders.embeddings import SentenceTransformerEncoder

    index_dir = tmp_path_factory.mktemp("kb-index")
    ingest(REPO / "kb" / "avap", index_dir, SentenceTransformerEncoder(), progress=False)
    return index_dir


@pytest.fixture
async def parser() -> AsyncIterator[Any]:
    """The real AVAP parser on a free port, counting Validate calls: (address, servicer)."""
    from tests.helpers.parser import serve_counting

    async for served in serve_counting():
        yield served
