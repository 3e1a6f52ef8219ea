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
    # An OpenAI-compatible chat server (`up --llm` runs llama.cpp's), as the OpenAI SDK
    # reads it: the base URL used as given, `/v1` included (https://api.openai.com/v1;
    # `/chat/completions` is appended; its key: `common.openai_api_key`), and the slots'
    # models there (unset: the OLLAMA_MODEL_NAME* names; see `model`).
    openai_base_url: Annotated[str, env("OPENAI_BASE_URL")] = ""
    openai_model: Annotated[str, env("OPENAI_MODEL")] = ""
    openai_model_conversational: Annotated[str, env("OPENAI_MODEL_CONVERSATIONAL")] = ""
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
    def backend_kind(self) -> str:
        """The backend `auto` resolves to (`backend` itself otherwise)."""
        if self.backend != "auto":
            return self.backend
        return ("ollama" if self.ollama_host
                else "openai" if self.openai_base_url else "extractive")

    @property
    def model(self) -> str:
        """RC-05: the slot's model (the conversational slot falls back to the main one).
        On the OpenAI-compatible server: OPENAI_MODEL_CONVERSATIONAL (that slot only),
        then OPENAI_MODEL, then the OLLAMA_MODEL_NAME* names."""
        conversational = self.slot == ModelSlot.CONVERSATIONAL
        if self.backend_kind == "openai":
            own = (self.openai_model_conversational if conversational else "")
            if own or self.openai_model:
                return own or self.openai_model
        if conversational:
            return self.common.conversational_model
        return self.common.model_main

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, slot: ModelSlot | None = None
    ) -> GeneratorSettings:
        given = {"slot": slot} if slot else {}
        return read_env(cls, environ, common=CommonSettings.from_env(environ), **given)
