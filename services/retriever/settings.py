from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import msgspec

from services.retriever.fusion import FusionSettings
from shared.common.settings import CommonSettings, env, env_group, read_env
from shared.encoders.embeddings import DEFAULT_MODEL


class RetrieverSettings(msgspec.Struct, frozen=True, kw_only=True):
    # Its index (INDEX_DIR) and Ollama's address are common settings (the CLI and other
    # stages read them).
    common: CommonSettings
    # bm25 | dense | hybrid
    method: Annotated[str, env("RETRIEVER_METHOD")] = "hybrid"
    # Passages handed to the generator.
    top_k: Annotated[int, env("RETRIEVER_TOP_K")] = 8
    # The hybrid's fusion (services/retriever/fusion.py): "score" adds BM25's and the
    # cosine's scores each divided by its best hit, "rrf" is Reciprocal Rank Fusion.
    # SciFact nDCG@10, weights chosen by 5-fold CV on train (809 queries), then on test
    # (300): score 1:1 CV 0.736, test 0.733; plain RRF (k=60) train 0.715, test 0.712;
    # RRF tuned by CV 0.730, test 0.714 (`python -m bench.retrieval fusion-cv`).
    fusion: Annotated[FusionSettings, env_group(
        method="RETRIEVER_FUSION",
        bm25_weight="RETRIEVER_BM25_WEIGHT",
        dense_weight="RETRIEVER_DENSE_WEIGHT",
        rrf_k="RETRIEVER_RRF_K",
        depth="RETRIEVER_FUSION_DEPTH",
    )] = FusionSettings()
    # The sentence encoder of the index and the queries (ingest again after a change).
    embedding_model: Annotated[str, env("EMBEDDING_MODEL")] = DEFAULT_MODEL
    # Elasticsearch backend instead of the embedded index when set.
    es_url: Annotated[str, env("ES_URL")] = ""
    es_index: Annotated[str, env("ES_INDEX")] = "intentroute-kb"
    # Messages one replica pulls and handles at once.
    batch_size: Annotated[int, env("RETRIEVER_BATCH")] = 16
    # Relevance check for RETRIEVAL: "embedding" | "llm" | "off"
    relevance_mode: Annotated[str, env("RELEVANCE_CHECK")] = "embedding"
    # The embedding check's signal and threshold ("nan": the calibrated one), and how
    # the one retry reformulates the query ("broaden", "prf", "both").
    relevance_signal: Annotated[str, env("RELEVANCE_SIGNAL")] = "combined"
    relevance_threshold: Annotated[float, env("RELEVANCE_THRESHOLD")] = float("nan")
    retry_strategy: Annotated[str, env("RELEVANCE_RETRY_STRATEGY")] = "broaden"
    # The LLM judge's model on the configured model server (Ollama, else the
    # OpenAI-compatible one: common settings); unset: the conversational slot's model
    # there ("" = none). Seconds it may take per check.
    relevance_model: Annotated[str, env(
        "RELEVANCE_MODEL", unset=lambda s, _: s.common.slot_model(
            s.common.llm_backend, conversational=True))] = ""
    relevance_timeout: Annotated[float, env("RELEVANCE_TIMEOUT")] = 5.0

    @property
    def index_dir(self) -> Path:
        return self.common.index_dir

    @property
    def ollama_host(self) -> str:
        return self.common.ollama_host

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RetrieverSettings:
        return read_env(cls, environ, common=CommonSettings.from_env(environ))
