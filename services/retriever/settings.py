from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import msgspec

from shared.common.settings import CommonSettings, env, read_env
from shared.encoders.embeddings import DEFAULT_MODEL


class RetrieverSettings(msgspec.Struct, frozen=True, kw_only=True):
    # Its index (INDEX_DIR) and Ollama's address are common settings (the CLI and other
    # stages read them).
    common: CommonSettings
    # bm25 | dense | hybrid
    method: Annotated[str, env("RETRIEVER_METHOD")] = "hybrid"
    top_k: Annotated[int, env("RETRIEVER_TOP_K")] = 8
    embedding_model: Annotated[str, env("EMBEDDING_MODEL")] = DEFAULT_MODEL
    # Elasticsearch backend instead of the embedded index when set.
    es_url: Annotated[str, env("ES_URL")] = ""
    es_index: Annotated[str, env("ES_INDEX")] = "intentroute-kb"
    batch_size: Annotated[int, env("RETRIEVER_BATCH")] = 16
    # Relevance check for RETRIEVAL: "embedding" | "llm" | "off"
    relevance_mode: Annotated[str, env("RELEVANCE_CHECK")] = "embedding"
    relevance_signal: Annotated[str, env("RELEVANCE_SIGNAL")] = "combined"
    relevance_threshold: Annotated[float, env("RELEVANCE_THRESHOLD")] = float("nan")
    retry_strategy: Annotated[str, env("RELEVANCE_RETRY_STRATEGY")] = "broaden"
    # The LLM judge's model; unset: the conversational slot's ("" = none).
    relevance_model: Annotated[str, env(
        "RELEVANCE_MODEL", unset=lambda s, _: s.common.conversational_model)] = ""

    @property
    def index_dir(self) -> Path:
        return self.common.index_dir

    @property
    def ollama_host(self) -> str:
        return self.common.ollama_host

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RetrieverSettings:
        return read_env(cls, environ, common=CommonSettings.from_env(environ))
