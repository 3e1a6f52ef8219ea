"""The OpenAI-compatible door: `wire` (the format, pure), `models` (the model names an
agent may use, pure), `stream` (an answer as server-sent events), `routes` (the HTTP
handlers)."""
