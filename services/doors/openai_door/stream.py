"""One answer as OpenAI streams it: `data: {chat.completion.chunk}` server-sent events
(the role first, the text as the pipeline streams it, status notes left out, a chunk
with `finish_reason` and the usage, `data: [DONE]`), or an error event
`data: {"error": {...}}` (the SDK raises APIError) with no `[DONE]` after it.

The model that wrote the answer is known on the final chunk only: the chunks before it
carry the name asked, the finishing chunk and the usage chunk the answering model
(wire.answering_model).

A restart never reaches the caller as two answers run together. A model that fails
mid-answer is continued by the next one (the text goes on: nothing to do) or restarted:
a RESET chunk, then the new answer from its start, scoped to the current part of a split
message (a reset drops the text since the part's marker: shared.runtime.message_parts).
This protocol cannot take sent text back, so:
- nothing of the part sent yet: the reset is dropped and the stream goes on;
- some of it sent: the stream ends with an error event, the answer's own error when the
  reset is followed by one (the answer failed), else ANSWER_RESTARTED (a second answer
  began). A collected answer (`stream: false`) is the restarted answer alone
  (shared.client.caller.assemble).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import msgspec
from aiohttp import web
from msgspec import UNSET, UnsetType

from services.doors.openai_door import wire
from services.doors.openai_door.wire import Delta, Usage
from shared.client.caller import is_text
from shared.contracts.errors import IntentrouteError
from shared.contracts.request import AgentRequest
from shared.contracts.response import ChunkKind, ErrorCode, ResponseChunk

log = logging.getLogger("intentroute.doors.openai")

_encode = msgspec.json.Encoder().encode
_DONE = b"data: [DONE]\n\n"

RESTARTED = ("the answer was restarted after part of it was streamed (its model failed "
             "mid-answer and the next one began again); a stream cannot take back what it "
             "sent: ask again (a collected answer, stream: false, is the restarted one alone)")


class Events:
    """One answer as server-sent events, as OpenAI streams them."""

    def __init__(self, resp: web.StreamResponse, req: AgentRequest, chat: wire.ChatRequest
                 ) -> None:
        self.resp = resp
        self.req = req
        self.asked = chat.model
        self.created = int(time.time())
        self.include_usage = chat.include_usage
        # With include_usage OpenAI sends `"usage": null` on every chunk but the last.
        self.no_usage: UnsetType | None = None if self.include_usage else UNSET
        # Text of the current part (since its marker; the whole answer without parts)
        # has gone out.
        self.part_sent = False
        # A reset came after text of its part went out: the stream ends at what follows.
        self.restarted = False

    async def send(self, event: msgspec.Struct) -> None:
        await self.resp.write(b"data: " + _encode(event) + b"\n\n")

    async def error(self, code: str, message: str) -> None:
        await self.send(wire.error_envelope(code, message)[1])

    async def delta(self, delta: Delta, finish: str | None = None, *, model: str = "",
                    usage: Usage | UnsetType | None = UNSET,
                    info: wire.RouteInfo | UnsetType = UNSET) -> None:
        await self.send(wire.chunk(self.req.request_id, model or self.asked, self.created,
                                   delta, finish,
                                   usage=self.no_usage if usage is UNSET else usage,
                                   info=info))

    async def relay(self, piece: ResponseChunk) -> bool:
        """Send what `piece` adds; False once the stream has ended (its final sent, or
        an error event)."""
        if self.restarted:
            if piece.is_final and piece.error is not None:
                await self.error(piece.error.code, piece.error.message)
            else:
                log.info("[%s] a streamed answer restarted after text went out: ended "
                         "with %s", self.req.request_id, ErrorCode.ANSWER_RESTARTED)
                await self.error(ErrorCode.ANSWER_RESTARTED, RESTARTED)
            return False
        if piece.kind == ChunkKind.RESET:
            self.restarted = self.part_sent
            return True
        if is_text(piece) and piece.text:
            await self.delta(Delta(content=piece.text))
            # A part's heading stays through a reset of the part: not its text.
            self.part_sent = piece.kind != ChunkKind.PART
        if not piece.is_final:
            return True
        if piece.error is not None:
            await self.error(piece.error.code, piece.error.message)
            return False
        await self.finish(piece)
        return False

    async def finish(self, final: ResponseChunk) -> None:
        """The finishing chunk (and the usage chunk), named by the answering model."""
        usage = wire.usage_of(final)
        model = wire.answering_model(final, self.asked)
        await self.delta(Delta(), "stop", model=model,
                         usage=None if self.include_usage else usage,
                         info=wire.route_info(final, self.req))
        if self.include_usage:
            await self.send(wire.usage_chunk(self.req.request_id, model, self.created,
                                             usage))
        await self.resp.write(_DONE)


async def stream(request: web.Request, req: AgentRequest, chat: wire.ChatRequest,
                 first: ResponseChunk, answer: AsyncIterator[ResponseChunk],
                 headers: dict[str, str]) -> web.StreamResponse:
    """Stream the answer whose first chunk is `first` (the rest from `answer`), with the
    response's `headers`."""
    resp = web.StreamResponse(headers={
        **headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no"})  # nginx and the like: pass each event on at once
    await resp.prepare(request)
    events = Events(resp, req, chat)
    # A client gone (ConnectionResetError on a write) ends the stream quietly, the
    # error event's write included: a client that left while the pipeline stalled
    # made the door's 504 event a traceback in the log.
    try:
        try:
            await events.delta(Delta(role="assistant", content=""))
            more = await events.relay(first)
            while more:
                more = await events.relay(await anext(answer))
        except IntentrouteError as exc:  # after text went out: an error event
            await events.error(exc.code, exc.message)
    except ConnectionResetError:
        log.debug("[%s] the client left mid-stream", req.request_id)
    except asyncio.CancelledError:  # the server saw the connection close (start_http)
        log.debug("[%s] the client left mid-stream", req.request_id)
        raise
    return resp
