"""gRPC request bodies that do not decode, answered after the token is checked.

grpc decodes a request before the servicer runs; a body that does not parse raises in
the deserializer, which grpc logs as an ERROR with a traceback and answers UNKNOWN,
before anyone looked at the caller's token: an anonymous flood of junk was a flood of
tracebacks. `DeferDecodeErrors` (a server interceptor) wraps every method's
deserializer so a body that does not decode becomes an `Undecodable` value; the
servicer checks the token first (UNAUTHENTICATED without a valid one) and then answers
`reject_undecodable`'s INVALID_ARGUMENT. Nothing is logged for it. The methods of the
services that ask for no token (health, reflection: `open_services`) get the same
INVALID_ARGUMENT before their servicer runs (`refusing`): their servicers, not ours,
would fail on an `Undecodable` with a traceback of their own.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
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


def refusing(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """`handler` with its behaviour answering an `Undecodable` request (or a streamed
    one) with `reject_undecodable` before the servicer sees it."""
    if handler.unary_unary is not None:
        unary = handler.unary_unary

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, Undecodable):
                await reject_undecodable(context, request)
            return await unary(request, context)
        return handler._replace(unary_unary=unary_unary)
    if handler.unary_stream is not None:
        streaming = handler.unary_stream

        async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> None:
            if isinstance(request, Undecodable):
                await reject_undecodable(context, request)
            await _respond(streaming(request, context), context)
        return handler._replace(unary_stream=unary_stream)
    if handler.stream_stream is not None:
        both = handler.stream_stream

        async def stream_stream(requests: AsyncIterator[Any],
                                context: grpc.aio.ServicerContext) -> None:
            async def checked() -> AsyncIterator[Any]:
                async for request in requests:
                    if isinstance(request, Undecodable):
                        await reject_undecodable(context, request)
                    yield request
            await _respond(both(checked(), context), context)
        return handler._replace(stream_stream=stream_stream)
    return handler


async def _respond(result: Any, context: grpc.aio.ServicerContext) -> None:
    """A streaming servicer's responses: yielded (an async generator) or written by the
    servicer itself (a coroutine using `context.write`)."""
    if inspect.isasyncgen(result):
        async for response in result:
            await context.write(response)
    else:
        await result


# grpc ships no type information: its interceptor base is Any to mypy.
class DeferDecodeErrors(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, open_services: Collection[str] = ()) -> None:
        # Method name -> its wrapped handler; only methods the server has (a caller's
        # made-up names find no handler and are not kept).
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        # Full names of the services whose methods check no token: an undecodable body
        # is refused before their servicer runs.
        self._open = tuple(f"/{name}/" for name in open_services)

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
        if method.startswith(self._open):
            wrapped = refusing(wrapped)
        self._handlers[method] = wrapped
        return wrapped


async def reject_undecodable(context: grpc.aio.ServicerContext,
                             body: Undecodable) -> NoReturn:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                        f"the request body ({body.size} bytes) is not a valid message "
                        f"({body.problem})")
    raise AssertionError("unreachable")
