"""The Protocols this service's handlers depend on; adapters implement them, tests pass fakes.

A `ChatBackend` (backends.py: Ollama, an OpenAI-compatible server, echo) streams the
answer's text pieces and, at most once and last, the token counts the model server
reported for the call (`TokenCounts`); it raises `BackendUnavailableError` when the model
server could not be reached or failed before the first token."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import msgspec

from services.generator.prompts import ChatMessage


class BackendUnavailableError(Exception):
    """The model server could not be reached or failed before the first token."""


class TokenCounts(msgspec.Struct, frozen=True):
    """Tokens of one call as the server counted them (None: it did not say)."""

    prompt: int | None
    completion: int | None


class ChatBackend(Protocol):
    name: str

    def stream(
        self, model: str, messages: list[ChatMessage]
    ) -> AsyncIterator[str | TokenCounts]: ...
