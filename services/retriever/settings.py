from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import msgspec

from shared.common.settings import CommonSettings, env_float, env_int, env_str
from shared.encoders.embeddings import DEFAULT_MODEL


class RetrieverSettings(msgspec.Struct, frozen=True, kw_only=True):
    common: CommonSettings
    index_dir: Path = Path(".intentroute/index")
    # bm25 | dense | hybrid
    method: str = "hybrid"
    top_k: int = 8
    embedding_model: str = DEFAULT_MODEL
    # Elasticsearch backend instead of the embedded index when set.
    es_url: str = ""
    es_index: str = "intentroute-kb"
    batch_size: int = 16
    # Relevance check for RETRIEVAL: "embedding" | "llm" | "off"
    relevance_mode: str = "embedding"
    relevance_signal: str = "combined"
    relevance_threshold: float = float("nan")
    retry_strategy: str = "broaden"
    ollama_host: str = ""
    relevance_model: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RetrieverSettings:
        return cls(
            common=CommonSettings.from_env(environ),
            index_dir=Path(env_str("INDEX_DIR", ".intentroute/index", environ)),
            method=env_str("RETRIEVER_METHOD", "hybrid", environ),
            top_k=env_int("RETRIEVER_TOP_K", 8, environ),
            embedding_model=env_str("EMBEDDING_MODEL", DEFAULT_MODEL, environ),
            es_url=env_str("ES_URL", "", environ),
            es_index=env_str("ES_INDEX", "intentroute-kb", environ),
            batch_size=env_int("RETRIEVER_BATCH", 16, environ),
            relevance_mode=env_str("RELEVANCE_CHECK", "embedding", environ),
            relevance_signal=env_str("RELEVANCE_SIGNAL", "combined", environ),
            relevance_threshold=env_float("RELEVANCE_THRESHOLD", float("nan"), environ),
            retry_strategy=env_str("RELEVANCE_RETRY_STRATEGY", "broaden", environ),
            ollama_host=env_str("OLLAMA_HOST", "", environ),
            relevance_model=env_str(
                "RELEVANCE_MODEL",
                env_str("OLLAMA_MODEL_NAME_CONVERSATIONAL", "", environ)
                or env_str("OLLAMA_MODEL_NAME", "", environ),
                environ,
            ),
        )
