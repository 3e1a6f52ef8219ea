"""gRPC request bodies that do not decode, answered after the token is checked.

grpc decodes a request before the servicer runs; a body that does not parse raises in
the deserializer, which grpc logs as an ERROR with a traceback and answers UNKNOWN,
before anyone looked at the caller's token: an anonymous flood of junk was a flood of
tracebacks. `DeferDecodeErrors` (a server interceptor) wraps every method's
deserializer so a body that does not decode becomes an `Undecodable` value; the
servicer checks the token first (UNAUTHENTICATED without a valid one) and then answers
`reject_undecodable`'s INVALID_ARGUMENT. Nothing is logged for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import grpc

Deserializer = Callable[[bytes], Any]


class Undecodable:
    """A request body that did not decode: its size and the decoder's complaint."""

    __slots__ = ("problem", "size")

    def __init__(self, size: int, problem: str) -> None:
        self.size = size
        self.problem = problem


def deferring(deserialize: Deserializer) -> Deserializer:
    """`deserialize`, returning an `Undecodable` instead of raising."""
    def run(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except Exception as exc:  # protobuf's DecodeError and whatever else a parser raises
            return Undecodable(len(raw), type(exc).__name__)
    return run


# grpc ships no type information: its interceptor base is Any to mypy.
class DeferDecodeErrors(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self) -> None:
        # Method name -> its wrapped handler; only methods the server has (a caller's
        # made-up names find no handler and are not kept).
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails],
                               Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        cached = self._handlers.get(method)
        if cached is not None:
            return cached
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        # The handlers grpc builds are namedtuples (grpc._utilities.RpcMethodHandler).
        wrapped: grpc.RpcMethodHandler = handler._replace(
            request_deserializer=deferring(handler.request_deserializer))
        self._handlers[method] = wrapped
        return wrapped


async def reject_undecodable(context: grpc.aio.ServicerContext,
                             body: Undecodable) -> NoReturn:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                        f"the request body ({body.size} bytes) is not a valid message "
                        f"({body.problem})")
    raise AssertionError("unreachable")
