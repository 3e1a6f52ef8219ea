"""The Protocols this service's handlers depend on; adapters implement them, tests pass fakes.

A `ChatBackend` (backends.py: Ollama, an OpenAI-compatible server, echo) streams the
answer's text pieces and, at most once and last, the token counts the model server
reported for the call (`TokenCounts`); it raises `BackendUnavailableError` when the model
server could not be reached or failed before the first token. All three are the shared
model-server vocabulary (`shared.llm.ports`)."""

from __future__ import annotations

from shared.llm.ports import BackendUnavailableError, ChatBackend, TokenCounts

__all__ = ["BackendUnavailableError", "ChatBackend", "TokenCounts"]
