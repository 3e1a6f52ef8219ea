"""The real AVAP parser service on a free loopback port, counting its Validate calls
(RC-08: one trace-guided retry means exactly two)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from intentroute.stack import free_port
from services.parser.server import AvapParserService, serve


class CountingParser(AvapParserService):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def Validate(self, request: Any, context: Any) -> Any:
        self.calls += 1
        return await super().Validate(request, context)


async def serve_counting() -> AsyncIterator[tuple[str, CountingParser]]:
    """The `parser` fixture's body (tests/conftest.py): (address, servicer)."""
    port = free_port()
    servicer = CountingParser()
    server = await serve("127.0.0.1", port, servicer=servicer)
    yield f"127.0.0.1:{port}", servicer
    await server.stop(0)
