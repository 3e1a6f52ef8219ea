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


class ChatBackend(Protocol):
    """Streams the answer's text pieces and, at most once and last, the token counts the
    model server reported for the call; raises `BackendUnavailableError` when the server
    could not be reached or failed before the first token."""

    name: str

    def stream(
        self, model: str, messages: list[ChatMessage]
    ) -> AsyncIterator[str | TokenCounts]: ...


class ChoiceBackend(Protocol):
    """Asks for one of `choice.options`, the output constrained by the server itself
    (temperature 0): the option chosen, None when the answer is off-schema; raises
    `BackendUnavailableError` when no answer came within `timeout` seconds."""

    name: str

    async def choose(self, model: str, messages: list[ChatMessage], choice: Choice, *,
                     timeout: float) -> str | None: ...
