"""A Python client for intentroute's NATS door, as the OpenAI client reads.

    import asyncio
    from intentroute.client import connect

    async def main() -> None:
        async with connect("myapp.json") as client:      # `intentroute agent add --out`
            answer = await client.ask("How do I loop from 1 to 10 in AVAP?")
            print(answer.text, answer.query_type)
            async for piece in client.stream("write an endpoint that returns the user id"):
                print(piece, end="", flush=True)
            await client.feedback(answer.request_id, "success")
            # A message asking several things is answered part by part: judge one.
            answer = await client.ask("explain addVar; also, how much quota do I have left?")
            for part in answer.parts:
                print(part.index, part.query_type, part.text)
            await client.feedback(answer.request_id, "user_rejected", part=1)

    asyncio.run(main())

`connect(creds)` takes an agent's credential: its file (`intentroute agent add NAME --out
FILE`; `up`'s demo agent: `.intentroute/creds/demo.json`) or the credential itself (the
JSON `agent add` prints, as a dict). It connects to NATS_URL when the environment sets
it, else to the servers the credential names. Use it with `async with`, or `await` it
and `await client.close()` at the end.

Every question is one request on `agent.request.<agent>`: the answer streams back on
the agent's response subject and ends in one final chunk, which `ask` returns as an
`Answer` (its text, and the final chunk's fields: the type, the routing decision, the
validation status, who answered) and `stream` yields after the text pieces when asked
for `chunks=True`. A request that ends in an error (refused by the agent's limits, a
bad field, a deadline) raises `AnswerError` with the code, the message and, for a
refusal, when to ask again. A session keeps the conversation (CONVERSATIONAL questions
reshape the session's previous answer): one per client unless a call names another.

This module is a thin face over `shared.client` (the caller's side of the contract,
which `intentroute ask` and the gRPC and OpenAI doors use): every question, reconnect
and replay goes through it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, overload

import msgspec
from nats.aio.client import Client as NatsClient

from shared.auth.natsconn import Credential, read_credential
from shared.client.caller import ask as _ask
from shared.client.caller import assemble, is_text, send_feedback
from shared.client.connect import connect_agent
from shared.contracts.feedback import Feedback, FeedbackAck, FeedbackMetadata, FeedbackOutcome
from shared.contracts.request import AgentRequest
from shared.contracts.response import ChunkKind, PartResult, ResponseChunk
from shared.contracts.routing import RoutingDecision

__all__ = ["Answer", "AnswerError", "Client", "FeedbackAck", "PartResult", "ResponseChunk",
           "connect"]

# Seconds an answer may take once asked, unless a call says otherwise.
DEFAULT_TIMEOUT = 120.0


class AnswerError(Exception):
    """A request that ended in an error chunk: `code` (MISSING_FIELD, RATE_LIMITED,
    DEADLINE_EXCEEDED, ...; docs: The NATS door, Resets and errors), `message`, and for a
    refusal `retry_after_ms` (0: not said)."""

    def __init__(self, final: ResponseChunk) -> None:
        error = final.error
        self.code = error.code if error else "UNKNOWN"
        self.message = error.message if error else ""
        self.retry_after_ms = error.retry_after_ms if error else 0
        self.request_id = final.request_id
        self.final = final
        super().__init__(f"{self.code}: {self.message}")


class Answer(msgspec.Struct, frozen=True, kw_only=True):
    """One answer: its text and its final chunk (every field of it below)."""

    text: str
    final: ResponseChunk

    @property
    def request_id(self) -> str:
        return self.final.request_id

    @property
    def query_type(self) -> str:
        """RETRIEVAL, CODE_GENERATION, CONVERSATIONAL or PLATFORM."""
        return self.final.query_type

    @property
    def decision(self) -> RoutingDecision | None:
        """How the type was decided: layer, confidence, model slot, clarity, ..."""
        return self.final.decision

    @property
    def declared_ignored(self) -> bool:
        """A `query_type` was declared and ignored (only trusted agents may declare)."""
        return bool(self.final.decision and self.final.decision.declared_ignored)

    @property
    def history_unavailable(self) -> bool:
        """The session could not be read in time (Postgres paused or away): decided
        without its history, or a rephrase answered without the previous answer."""
        return bool(self.final.decision and self.final.decision.history_unavailable)

    @property
    def answered_by(self) -> str:
        """`backend/model`, or `extractive` (the answer was built from passages)."""
        return self.final.answered_by

    @property
    def validation_status(self) -> str:
        """"" (valid or no code), INVALID_UNRESOLVED or PARSER_UNAVAILABLE."""
        return self.final.validation_status

    @property
    def avap_code(self) -> str:
        return self.final.avap_code

    @property
    def parts(self) -> list[PartResult]:
        """A message carrying several requests, answered part by part: each part's
        `index` (from 0), text, type, decision, validation status and code, in order;
        [] for an answer of one request. `feedback(..., part=index)` judges one."""
        return self.final.parts


def _credential(creds: str | Path | Mapping[str, Any] | Credential) -> Credential:
    if isinstance(creds, Credential):
        return creds
    if isinstance(creds, Mapping):
        return msgspec.convert(dict(creds), Credential)
    return read_credential(Path(creds).expanduser())


class Client:
    """An agent's connection (`connect`): `ask`, `stream`, `feedback`."""

    def __init__(self, nc: NatsClient, agent_id: str, *, session: str,
                 timeout: float) -> None:
        self.nc = nc
        self.agent_id = agent_id
        self.session = session
        self.timeout = timeout

    def _request(self, question: str, session: str | None, query_type: str | None,
                 extra_context: str, editor_context: str, timeout: float | None
                 ) -> AgentRequest:
        return AgentRequest(
            request_id=uuid.uuid4().hex, session_id=session or self.session,
            agent_id=self.agent_id, query=question, query_type=query_type,
            extra_context=extra_context, editor_context=editor_context,
            timeout_ms=int(timeout * 1000) if timeout else 0)

    async def ask(self, question: str, *, session: str | None = None,
                  query_type: str | None = None, extra_context: str = "",
                  editor_context: str = "", timeout: float | None = None) -> Answer:
        """Ask and wait for the whole answer. `query_type` is honoured for trusted
        agents only (`Answer.declared_ignored` says when it was not); `extra_context`
        is the platform's data for PLATFORM questions; `editor_context` the program the
        user is looking at. Raises AnswerError when the answer ends in an error."""
        chunks = [chunk async for chunk in self.stream(
            question, session=session, query_type=query_type, extra_context=extra_context,
            editor_context=editor_context, timeout=timeout, chunks=True)]
        return Answer(text=assemble(chunks), final=chunks[-1])

    @overload
    def stream(self, question: str, *, session: str | None = ...,
               query_type: str | None = ..., extra_context: str = ...,
               editor_context: str = ..., timeout: float | None = ...,
               chunks: Literal[False] = ...) -> AsyncIterator[str]: ...

    @overload
    def stream(self, question: str, *, session: str | None = ...,
               query_type: str | None = ..., extra_context: str = ...,
               editor_context: str = ..., timeout: float | None = ...,
               chunks: Literal[True]) -> AsyncIterator[ResponseChunk]: ...

    async def stream(self, question: str, *, session: str | None = None,
                     query_type: str | None = None, extra_context: str = "",
                     editor_context: str = "", timeout: float | None = None,
                     chunks: bool = False) -> AsyncIterator[Any]:
        """Ask and yield the answer as it comes: its text pieces (a stage that died
        mid-answer restarts it: "\\n[answer restarted]\\n" comes first), or with
        `chunks=True` every chunk, the final one last. Raises AnswerError after the
        text when the answer ends in an error."""
        req = self._request(question, session, query_type, extra_context, editor_context,
                            timeout)
        async for chunk in _ask(self.nc, req, timeout=timeout or self.timeout):
            if chunks:
                yield chunk
            elif chunk.kind == ChunkKind.RESET:
                yield "\n[answer restarted]\n"
            elif is_text(chunk) and chunk.text:
                yield chunk.text
            if chunk.is_final and chunk.error is not None:
                raise AnswerError(chunk)

    async def feedback(self, request_id: str, outcome: str | FeedbackOutcome, *,
                       quality: float | None = None, part: int | None = None
                       ) -> FeedbackAck:
        """Say how an answer went: success, fallback, timeout, error or user_rejected
        (and a 0-10 `quality`); a repeat replaces the earlier verdict. `part`: the verdict
        is on that part of an answer given part by part (its `index` in `Answer.parts`)
        and on it alone."""
        verdict = Feedback(request_id=request_id, outcome=FeedbackOutcome(outcome),
                           metadata=FeedbackMetadata(completion_quality=quality), part=part)
        return await send_feedback(self.nc, self.agent_id, verdict)

    async def close(self) -> None:
        await self.nc.drain()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _Connecting:
    """`connect(...)`: awaited, the client; as `async with`, the client, closed after."""

    def __init__(self, creds: str | Path | Mapping[str, Any] | Credential, session: str,
                 timeout: float) -> None:
        self._creds, self._session, self._timeout = creds, session, timeout
        self._client: Client | None = None

    async def _open(self) -> Client:
        cred = _credential(self._creds)
        nc = await connect_agent(cred)
        return Client(nc, cred.agent_id, session=self._session, timeout=self._timeout)

    def __await__(self) -> Any:
        return self._open().__await__()

    async def __aenter__(self) -> Client:
        self._client = await self._open()
        return self._client

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._client is not None:
            await self._client.close()


def connect(creds: str | Path | Mapping[str, Any] | Credential, *,
            session: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> _Connecting:
    """A client as the agent `creds` names (a credential file's path, or the credential
    as a dict): `async with connect(creds) as client`, or `client = await
    connect(creds)`. `session`: the conversation its questions belong to (default: a
    new one per client); `timeout`: seconds an answer may take."""
    return _Connecting(creds, session or f"py-{uuid.uuid4().hex[:12]}", timeout)
