from __future__ import annotations

from collections.abc import Mapping

import msgspec

from shared.common.settings import CommonSettings, env_float, env_int, env_str
from shared.contracts.routing import ModelSlot


class GeneratorSettings(msgspec.Struct, frozen=True, kw_only=True):
    common: CommonSettings
    slot: ModelSlot = ModelSlot.MAIN
    ollama_host: str = ""
    # RC-05: main slot model; the conversational slot falls back to it when unset.
    model_main: str = ""
    model_conversational: str = ""
    ollama_timeout: float = 120.0
    # An OpenAI-compatible chat server (`up --llm` runs llama.cpp's): base URL, key.
    openai_base_url: str = ""
    openai_api_key: str = ""
    # "auto" (Ollama when OLLAMA_HOST is set, else the OpenAI-compatible server when
    # OPENAI_BASE_URL is, else extractive) | "ollama" | "openai" | "extractive" | "echo"
    backend: str = "auto"
    # The echo backend's answer time (chaos benchmark: answers in flight long enough to
    # be caught by a kill).
    echo_delay: float = 0.0
    # Concurrent answers per replica (answers stream for seconds; do not serialise them).
    concurrency: int = 16

    @property
    def model(self) -> str:
        if self.slot == ModelSlot.CONVERSATIONAL:
            return self.model_conversational or self.model_main
        return self.model_main

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, slot: ModelSlot | None = None
    ) -> GeneratorSettings:
        return cls(
            common=CommonSettings.from_env(environ),
            slot=slot or ModelSlot(env_str("GENERATOR_SLOT", "main", environ)),
            ollama_host=env_str("OLLAMA_HOST", "", environ),
            model_main=env_str("OLLAMA_MODEL_NAME", "", environ),
            model_conversational=env_str("OLLAMA_MODEL_NAME_CONVERSATIONAL", "", environ),
            ollama_timeout=env_float("OLLAMA_TIMEOUT", 120.0, environ),
            openai_base_url=env_str("OPENAI_BASE_URL", "", environ),
            openai_api_key=env_str("OPENAI_API_KEY", "", environ),
            backend=env_str("GENERATOR_BACKEND", "auto", environ),
            echo_delay=env_float("GENERATOR_ECHO_DELAY", 0.0, environ),
            concurrency=env_int("GENERATOR_CONCURRENCY", 16, environ),
        )
