"""Run workers in-process against the real servers, and talk to them as a caller."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faststream import FastStream, TestApp
from nats.aio.client import Client

from intentroute.workers import WORKERS, create_worker
from shared.client.caller import ask
from shared.contracts.request import AgentRequest
from shared.contracts.response import ResponseChunk

if TYPE_CHECKING:
    from services.retriever.ports import Retrieval, SearchResult


class RecordingRetrieval:
    """Wraps a real retrieval backend and records every query it is asked."""

    def __init__(self, inner: Retrieval) -> None:
        self.inner = inner
        self.queries: list[str] = []

    async def search(self, query: str, k: int) -> SearchResult:
        self.queries.append(query)
        return await self.inner.search(query, k)

    async def maybe_reload(self) -> bool:
        return await self.inner.maybe_reload()

    async def close(self) -> None:
        await self.inner.close()


def base_env(nats_url: str, database_url: str, index_dir: Path, **extra: str) -> dict[str, str]:
    env = {
        # The test stack's state: the workers' service credentials live there.
        "INTENTROUTE_HOME": os.environ.get("INTENTROUTE_HOME", ".intentroute"),
        "NATS_URL": nats_url,
        "DATABASE_URL": database_url,
        "INDEX_DIR": str(index_dir),
        "RETRIEVER_METHOD": "bm25",
        "STAGE_ACK_WAIT": "3",
        "LOG_LEVEL": "WARNING",
        "GENERATOR_BACKEND": "auto",
    }
    env.update(extra)
    return env


@asynccontextmanager
async def running(
    env: Mapping[str, str],
    names: tuple[str, ...] = WORKERS,
    *,
    retrievals: list[Any] | None = None,
    tracer_provider: Any = None,
) -> AsyncIterator[list[FastStream]]:
    """Start the named workers (a name may repeat for replicas) and stop them after."""
    apps: list[FastStream] = []
    retrievals = list(retrievals or [])
    async with AsyncExitStack() as stack:
        for name in names:
            if name == "retriever" and retrievals:
                from services.retriever.app import create_app
                from services.retriever.settings import RetrieverSettings

                app = create_app(RetrieverSettings.from_env(worker_env(env, name)),
                                 retrieval=retrievals.pop(0),
                                 tracer_provider=tracer_provider)
            else:
                app = create_worker(name, worker_env(env, name), tracer_provider=tracer_provider)
            await stack.enter_async_context(TestApp(app))
            apps.append(app)
        yield apps


@asynccontextmanager
async def gateway(nats_url: str, database_url: str, tmp_path: Path,
                  **extra: str) -> AsyncIterator[tuple[str, str]]:
    """A gateway worker and a doors worker with its gRPC and HTTP listeners: (gRPC
    address, HTTP URL)."""
    grpc_addr, http_url, listen = door_addresses()
    env = base_env(nats_url, database_url, tmp_path, **listen, **extra)
    async with running(env, ("gateway", "doors")):
        yield grpc_addr, http_url


def door_addresses() -> tuple[str, str, dict[str, str]]:
    """Free loopback addresses for the doors' faces: (gRPC address, HTTP URL, the
    GATEWAY_GRPC_LISTEN / GATEWAY_HTTP_LISTEN that serve them)."""
    from intentroute.stack import free_port

    grpc_addr, http_port = f"127.0.0.1:{free_port()}", free_port()
    return grpc_addr, f"http://127.0.0.1:{http_port}", {
        "GATEWAY_GRPC_LISTEN": grpc_addr, "GATEWAY_HTTP_LISTEN": f"127.0.0.1:{http_port}"}


def worker_env(env: Mapping[str, str], name: str) -> dict[str, str]:
    """`env` plus the worker's service credential when the stack runs with auth."""
    home = Path(env.get("INTENTROUTE_HOME", ""))
    if not (home / "creds").is_dir():
        return dict(env)
    from intentroute.stack.nats_users import service_env

    return {**env, **service_env(home, name)}


def make_request(query: str, **fields: Any) -> AgentRequest:
    fields.setdefault("session_id", f"s-{uuid.uuid4().hex[:8]}")
    fields.setdefault("agent_id", "tests")  # trusted: it may declare query types
    fields.setdefault("request_id", uuid.uuid4().hex)
    return AgentRequest(query=query, **fields)


async def ask_all(nc: Client, req: AgentRequest, timeout: float = 30.0) -> list[ResponseChunk]:
    return [chunk async for chunk in ask(nc, req, timeout=timeout)]
