"""The backend the settings name: Ollama when OLLAMA_HOST is set, else the
OpenAI-compatible server at OPENAI_BASE_URL in its dialect (OPENAI_SERVER), else none."""

from __future__ import annotations

from shared.common.settings import CommonSettings, OpenAIServer
from shared.llm.ollama import OllamaBackend
from shared.llm.openai import LlamaCppBackend, OpenAIBackend


def open_backend(common: CommonSettings, kind: str | None = None, *,
                 timeout: float) -> OllamaBackend | OpenAIBackend | None:
    """The `kind` backend ("ollama" | "openai"; default: `common.llm_backend`), None when
    its server is not configured. Calls time out after `timeout` seconds."""
    kind = common.llm_backend if kind is None else kind
    if kind == "ollama" and common.ollama_host:
        return OllamaBackend(common.ollama_host, timeout=timeout)
    if kind == "openai" and common.openai_base_url:
        dialect = (LlamaCppBackend if common.openai_server is OpenAIServer.LLAMACPP
                   else OpenAIBackend)
        return dialect(common.openai_base_url, api_key=common.openai_api_key,
                       timeout=timeout)
    return None
