from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

import msgspec

from shared.common.settings import CommonSettings, env, read_env
from shared.contracts.routing import ModelSlot


class GeneratorSettings(msgspec.Struct, frozen=True, kw_only=True):
    # Its model servers too: OLLAMA_HOST, OLLAMA_MODEL_NAME(_CONVERSATIONAL) and the
    # OpenAI-compatible server's OPENAI_* are common settings (Layer 3, the relevance
    # judge and the CLI read them).
    common: CommonSettings
    # The model slot this worker serves (`worker generator-main` / `-conversational`).
    slot: Annotated[ModelSlot, env("GENERATOR_SLOT")] = ModelSlot.MAIN
    # Seconds one model step of the fallback chain may take (bounded by the deadline).
    ollama_timeout: Annotated[float, env("OLLAMA_TIMEOUT")] = 120.0
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
    def openai_base_url(self) -> str:
        return self.common.openai_base_url

    @property
    def backend_kind(self) -> str:
        """The backend `auto` resolves to (`backend` itself otherwise)."""
        if self.backend != "auto":
            return self.backend
        return self.common.llm_backend or "extractive"

    @property
    def model(self) -> str:
        """RC-05: the slot's model on the chosen backend (`CommonSettings.slot_model`)."""
        return self.common.slot_model(self.backend_kind,
                                      conversational=self.slot == ModelSlot.CONVERSATIONAL)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, slot: ModelSlot | None = None
    ) -> GeneratorSettings:
        given = {"slot": slot} if slot else {}
        return read_env(cls, environ, common=CommonSettings.from_env(environ), **given)
