"""An OpenAI-compatible chat server (OpenAI, vLLM, llama.cpp's, ...): answers streamed as
server-sent events with the counts from the final `usage` event; labels constrained by
`response_format` (a strict JSON schema), or, on llama.cpp's server
(`LlamaCppBackend`), by its own `grammar` field.

`base_url` follows the OpenAI SDK's `OPENAI_BASE_URL`: it is used as given, `/v1`
included (`https://api.openai.com/v1`), and `/chat/completions` is appended."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from shared.common.deadline import time_left
from shared.llm.choice import Choice
from shared.llm.faults import Fault, ModelError, classify_status
from shared.llm.ports import (
    ChatMessage,
    Ended,
    Started,
    StreamEvent,
    TokenCounts,
)

if TYPE_CHECKING:
    pass

log = logging.getLogger("intentroute.llm")


class ProbeFailure(NamedTuple):
    """Why a model server would fail: its HTTP status (None: no answer at all)."""

    status: int | None
    reason: str


class OpenAIBackend:
    """A call that fails before any answer because the server closed the kept-alive
    connection it went out on ("Server disconnected without sending a response") raises
    RESET, which the chain retries once on the same model (shared.llm.walk): against
    llama.cpp's server, 2 of ~40 calls of `bench codegen` that followed another at once
    failed so, in 0.0 s. `name` is the backend's name in the fleet."""

    name = "openai"

    def __init__(self, base_url: str, *, api_key: str = "", timeout: float = 120.0,
                 name: str = "") -> None:
        if name:
            self.name = name
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # httpx joins a relative path onto the base's path ("http://h/v1" + "models" =
        # "http://h/v1/models").
        self.base_url = base_url.rstrip("/")
        self._client = httpx.AsyncClient(base_url=self.base_url + "/",
                                         headers=headers, timeout=timeout)

    async def probe(self, timeout: float = 5.0) -> ProbeFailure | None:
        """Why calls would fail (`GET {base}/models`: a wrong URL or key shows there
        without spending a token), or None when the server answers."""
        import httpx

        url = f"{self._client.base_url}models"
        try:
            response = await self._client.get("models", timeout=timeout)
        except httpx.HTTPError as exc:
            return ProbeFailure(None, f"GET {url} failed: {exc!r}")
        if response.status_code == 200:
            return None
        detail = response.text[:200].replace("\n", " ")
        return ProbeFailure(response.status_code,
                            f"GET {url} -> HTTP {response.status_code}: {detail}")

    async def stream(
        self, model: str, messages: list[ChatMessage], *, prefill: str = ""
    ) -> AsyncIterator[StreamEvent]:
        """One answer as server-sent events (ports.ChatBackend); faults as ModelError:
        refused before any byte (connection refused: UNREACHABLE; dropped: RESET), an
        HTTP error by its status and body (faults.classify_status), broken after the
        first byte (CUT), a content-filter finish (CONTENT_FILTER)."""
        import httpx

        body = {"model": model, "stream": True, "stream_options": {"include_usage": True},
                "messages": _messages(messages, prefill)}
        answered = False
        try:
            async with self._client.stream("POST", "chat/completions", json=body) as response:
                answered = True
                if response.status_code != 200:
                    detail = (await response.aread())[:2000].decode(errors="replace")
                    fault = classify_status(response.status_code, detail,
                                            response.headers.get("retry-after"))
                    if prefill and response.status_code == 400 and fault.fault in (
                            Fault.REFUSED, Fault.CONTEXT_LENGTH) and "prefill" in detail.lower():
                        raise ModelError(Fault.PREFILL_REFUSED, fault.detail, status=400)
                    raise fault
                yield Started()
                finish, done = "", False
                async for line in response.aiter_lines():
                    if line.strip() == "data: [DONE]":
                        done = True
                        continue
                    event = _sse_event(line)
                    if event is None:
                        continue
                    for choice in event.choices:
                        if choice.delta.content:
                            yield choice.delta.content
                        if choice.finish_reason:
                            finish = choice.finish_reason
                    if event.usage is not None:
                        yield TokenCounts(event.usage.prompt_tokens,
                                          event.usage.completion_tokens)
                if finish == "content_filter":
                    raise ModelError(Fault.CONTENT_FILTER,
                                     "the provider's content filter stopped the answer")
                yield Ended(marked=done or bool(finish), finish_reason=finish)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise ModelError(Fault.UNREACHABLE, f"{self.base_url}: {exc!r}") from exc
        except httpx.HTTPError as exc:
            # Dropped before the response began (a kept-alive connection the server
            # closed, a reset): RESET, retried once; after it: CUT mid-answer.
            broke = Fault.CUT if answered else Fault.RESET
            raise ModelError(broke, f"{self.base_url}: {exc!r}") from exc

    def constraint(self, choice: Choice) -> dict[str, Any]:
        """The body fields that constrain the answer to `choice`: OpenAI's structured
        outputs (`response_format` with a strict JSON schema)."""
        return {"response_format": {"type": "json_schema", "json_schema": {
            "name": choice.key, "strict": True, "schema": choice.schema()}}}

    async def choose(self, model: str, messages: list[ChatMessage], choice: Choice, *,
                     timeout: float) -> str | None:
        import httpx

        body = {"model": model, "messages": _messages(messages), "temperature": 0,
                "max_tokens": 32, "stream": False, **self.constraint(choice)}
        try:
            response = await asyncio.wait_for(
                self._client.post("chat/completions", json=body), time_left(timeout))
        except TimeoutError as exc:
            raise ModelError(Fault.NO_RESPONSE, f"{self.base_url}: no answer within "
                             f"{timeout:g}s") from exc
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise ModelError(Fault.UNREACHABLE, f"{self.base_url}: {exc!r}") from exc
        except httpx.HTTPError as exc:
            raise ModelError(Fault.RESET, f"{self.base_url}: {exc!r}") from exc
        if response.status_code != 200:
            raise classify_status(response.status_code, response.text[:2000],
                                  response.headers.get("retry-after"))
        try:
            answer = _COMPLETION.decode(response.content)
        except msgspec.DecodeError:
            return None
        text = answer.choices[0].message.content if answer.choices else None
        return choice.parse(text or "")

    async def aclose(self) -> None:
        await self._client.aclose()


class LlamaCppBackend(OpenAIBackend):
    """llama.cpp's server (`intentroute llm-server`): the OpenAI protocol, with the label
    constrained by its own `grammar` field (tighter than its `response_format` support,
    see `Choice.grammar`) and without the server's repeat penalty, which is set for
    answers (a label's tokens repeat the prompt's by design)."""

    def constraint(self, choice: Choice) -> dict[str, Any]:
        return {"grammar": choice.grammar(), "repeat_penalty": 1.0}


def _messages(messages: list[ChatMessage], prefill: str = "") -> list[dict[str, str]]:
    """The chat's messages; a prefill is the assistant's own message, last, for the
    model to continue (servers that take one continue it rather than answer anew)."""
    out = [{"role": m.role, "content": m.content} for m in messages]
    if prefill:
        out.append({"role": "assistant", "content": prefill})
    return out


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta = msgspec.field(default_factory=_Delta)
    finish_reason: str | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _ChatEvent(msgspec.Struct):
    choices: list[_Choice] = []
    usage: _Usage | None = None


class _Message(msgspec.Struct):
    content: str | None = None


class _CompletionChoice(msgspec.Struct):
    message: _Message = msgspec.field(default_factory=_Message)


class _Completion(msgspec.Struct):
    choices: list[_CompletionChoice] = []


_EVENT = msgspec.json.Decoder(_ChatEvent)
_COMPLETION = msgspec.json.Decoder(_Completion)


def _sse_event(line: str) -> _ChatEvent | None:
    """One `data: {...}` line of the stream as an event (None: a keep-alive, a comment,
    `[DONE]`, or a line that is not a chat event)."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return None
    try:
        return _EVENT.decode(data)
    except msgspec.DecodeError:  # not JSON, or JSON of another shape
        log.warning("openai: ignored a stream event that is not a chat chunk: %.200s", data)
        return None

