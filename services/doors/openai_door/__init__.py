"""The OpenAI-compatible door: `wire` (the format, pure), `routes` (the HTTP handlers)."""
