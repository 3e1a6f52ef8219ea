from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

import msgspec

from shared.common.settings import CommonSettings, env, read_env
from shared.contracts.routing import ModelSlot


class GeneratorSettings(msgspec.Struct, frozen=True, kw_only=True):
    # Its model servers too: OLLAMA_HOST, OLLAMA_MODEL_NAME(_CONVERSATIONAL) and
    # OPENAI_API_KEY are common settings (other stages and the CLI read them).
    common: CommonSettings
    slot: Annotated[ModelSlot, env("GENERATOR_SLOT")] = ModelSlot.MAIN
    ollama_timeout: Annotated[float, env("OLLAMA_TIMEOUT")] = 120.0
    # An OpenAI-compatible chat server (`up --llm` runs llama.cpp's): base URL (its key:
    # `common.openai_api_key`).
    openai_base_url: Annotated[str, env("OPENAI_BASE_URL")] = ""
    # "auto" (Ollama when OLLAMA_HOST is set, else the OpenAI-compatible server when
    # OPENAI_BASE_URL is, else extractive) | "ollama" | "openai" | "extractive" | "echo"
    backend: Annotated[str, env("GENERATOR_BACKEND")] = "auto"
    # The echo backend's answer time (chaos benchmark: answers in flight long enough to
    # be caught by a kill).
    echo_delay: Annotated[float, env("GENERATOR_ECHO_DELAY")] = 0.0
    # Concurrent answers per replica (answers stream for seconds; do not serialise them).
    concurrency: Annotated[int, env("GENERATOR_CONCURRENCY")] = 16

    @property
    def ollama_host(self) -> str:
        return self.common.ollama_host

    @property
    def openai_api_key(self) -> str:
        return self.common.openai_api_key

    @property
    def model(self) -> str:
        """RC-05: the slot's model (the conversational slot falls back to the main one)."""
        if self.slot == ModelSlot.CONVERSATIONAL:
            return self.common.conversational_model
        return self.common.model_main

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, slot: ModelSlot | None = None
    ) -> GeneratorSettings:
        given = {"slot": slot} if slot else {}
        return read_env(cls, environ, common=CommonSettings.from_env(environ), **given)
