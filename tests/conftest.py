"""Fixtures: real NATS (JetStream) and PostgreSQL for the whole session.

INTENTROUTE_TEST_NATS_URL / INTENTROUTE_TEST_DATABASE_URL point the tests at
running servers; otherwise embedded ones are started on free ports (the same
code path as `intentroute up`).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"

# Short redelivery so the crash tests do not wait 30 s; set before any worker starts.
os.environ.setdefault("STAGE_ACK_WAIT", "3")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    from intentroute.stack import embedded_stack
    from shared.store import migrate

    with embedded_stack(
        tmp_path_factory.mktemp("stack"),
        nats_url=os.environ.get("INTENTROUTE_TEST_NATS_URL", ""),
        database_url=os.environ.get("INTENTROUTE_TEST_DATABASE_URL", ""),
        auth=False,
    ) as (nats_url, database_url):
        migrate(database_url)
        yield nats_url, database_url


@pytest.fixture(scope="session")
def nats_url(stack: tuple[str, str]) -> str:
    return stack[0]


@pytest.fixture(scope="session")
def database_url(stack: tuple[str, str]) -> str:
    return stack[1]


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[object]:
    import nats

    client = await nats.connect(nats_url)
    yield client
    await client.drain()


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
    from services.retriever.index import ingest
    from shared.embeddings import SentenceTransformerEncoder

    index_dir = tmp_path_factory.mktemp("kb-index")
    ingest(REPO / "kb" / "avap", index_dir, SentenceTransformerEncoder(), progress=False)
    return index_dir
