"""What a model backend offers: a streamed answer (`ChatBackend`) and one label out of a
fixed set (`ChoiceBackend`); the messages they take and the errors they raise."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import msgspec

from shared.contracts.errors import RetryableError
from shared.contracts.response import ErrorCode
from shared.llm.choice import Choice


class ChatMessage(msgspec.Struct, frozen=True):
    role: str
    content: str


class BackendUnavailableError(RetryableError):
    """The model server could not be reached or failed before the first token."""

    code = ErrorCode.BACKEND_UNAVAILABLE


class TokenCounts(msgspec.Struct, frozen=True):
    """Tokens of one call as the server counted them (None: it did not say)."""

    prompt: int | None
    completion: int | None


class Started(msgspec.Struct, frozen=True):
    """The server answered (its first byte: the response's status and headers)."""


class Ended(msgspec.Struct, frozen=True):
    """The stream's end: `marked` when the server said it was complete (`[DONE]`, a
    finish reason, Ollama's `done`), False when it simply stopped (finalised at once
    with what came); `finish_reason` as the server gave it."""

    marked: bool
    finish_reason: str = ""


StreamEvent = str | TokenCounts | Started | Ended


class ChatBackend(Protocol):
    """Streams one answer: `Started` when the server answers, the text pieces, at most
    once the token counts it reported, and `Ended` last. `prefill` (an answer cut
    mid-stream) is sent as the assistant's own message for the model to continue.
    Raises `shared.llm.faults.ModelError` (a `BackendUnavailableError`) naming the
    fault; a malformed event in the middle is skipped and logged, never passed on."""

    name: str

    def stream(
        self, model: str, messages: list[ChatMessage], *, prefill: str = ""
    ) -> AsyncIterator[StreamEvent]: ...


class ChoiceBackend(Protocol):
    """Asks for one of `choice.options`, the output constrained by the server itself
    (temperature 0): the option chosen, None when the answer is off-schema; raises
    `BackendUnavailableError` when no answer came within `timeout` seconds."""

    name: str

    async def choose(self, model: str, messages: list[ChatMessage], choice: Choice, *,
                     timeout: float) -> str | None: ...
