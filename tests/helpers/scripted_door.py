"""The OpenAI door's routes over a scripted pipeline: a Door whose answers are given
chunks (`ScriptedDoor.script`), agents' policies given by hand (testkit's FakePolicies), the
chunks a pipeline sends (`text`, `final`). Used by the contract tests of the door."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import openai
from aiohttp import web
from aiohttp.test_utils import TestServer

from services.doors.door import Door
from services.doors.openai_door.routes import add_openai_routes
from services.doors.throttle import AuthThrottle
from shared.auth.ports import AgentInfo
from shared.contracts.errors import UnauthenticatedError
from shared.contracts.request import AgentRequest
from shared.contracts.response import ChunkKind, ResponseChunk
from shared.contracts.routing import Layer, ModelSlot, QueryType, RoutingDecision
from testkit.fakes import FakePolicies

DECISION = RoutingDecision(QueryType.RETRIEVAL, Layer.RULES, 0.97, ModelSlot.MAIN)
Script = list[ResponseChunk | Exception]
# Token -> agent.
TOKENS = {"good": "a", "other": "b"}


def text(seq: int, piece: str, kind: ChunkKind = ChunkKind.TEXT) -> ResponseChunk:
    return ResponseChunk(request_id="r", seq=seq, text=piece, kind=kind)


def final(seq: int, piece: str = "", **fields: Any) -> ResponseChunk:
    fields.setdefault("decision", DECISION)
    fields.setdefault("query_type", "RETRIEVAL")
    return ResponseChunk(request_id="r", seq=seq, text=piece, kind=ChunkKind.FINAL,
                         is_final=True, **fields)


class ScriptedDoor(Door):
    """The token `good` is agent `a` (`other`: agent `b`); each request is answered with
    `script`."""

    def __init__(self) -> None:
        super().__init__(None, None, AuthThrottle(""), answer_timeout=5)  # type: ignore[arg-type]
        self.script: Script = []
        self.asked: list[AgentRequest] = []

    async def caller(self, token: str, address: str) -> AgentInfo:
        if token not in TOKENS:
            raise UnauthenticatedError("a valid agent bearer token is required")
        return AgentInfo(TOKENS[token])

    async def answer(self, req: AgentRequest, **tracing: Any
                     ) -> AsyncGenerator[ResponseChunk, None]:
        self.asked.append(req)
        for item in self.script:
            if isinstance(item, Exception):
                raise item
            yield item


@contextlib.asynccontextmanager
async def serve_scripted(door: ScriptedDoor, policies: FakePolicies | None = None
                         ) -> AsyncIterator[str]:
    """`door`'s OpenAI routes, with `policies`, on a loopback server; yields its URL."""
    app = web.Application(client_max_size=64 * 1024)  # as the doors' (http.py)
    add_openai_routes(app, door, policies=policies)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url(""))
    finally:
        await server.close()


def client(base: str, key: str = "good") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
