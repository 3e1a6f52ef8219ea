"""The embedded index's lexical side: bm25s settings, the query/document tokenizer,
and building a bm25s index over chunks."""

from __future__ import annotations

import importlib.util
import logging
import re
from collections.abc import Sequence
from typing import Any

import msgspec

from services.retriever.indexing.chunking import Chunk

log = logging.getLogger(__name__)


def _default_stemmer() -> str | None:
    # Snowball English stemming (PyStemmer) matches what standard BM25 baselines
    # (Anserini/Lucene EnglishAnalyzer, Porter) do; without it BM25 loses ~0.03 nDCG@10
    # on SciFact. The index records its choice, so queries are always tokenized alike.
    if importlib.util.find_spec("Stemmer") is None:
        log.warning("PyStemmer not installed: BM25 without stemming (about -0.03 nDCG@10)")
        return None
    return "english"


class Bm25Config(msgspec.Struct, frozen=True):
    """bm25s settings. k1/b/method are the Lucene defaults; stopwords "en" is Lucene's
    33-word English list (bm25s.stopwords.STOPWORDS_EN)."""

    k1: float = 1.2
    b: float = 0.75
    method: str = "lucene"
    stopwords: str = "en"
    stemmer: str | None = msgspec.field(default_factory=_default_stemmer)


class Bm25Tokenizer:
    """Same rules as bm25s.tokenize (lowercase, `\\b\\w\\w+\\b`, stopwords, optional
    stemmer), callable per query without bm25s's per-call setup and progress bars."""

    def __init__(self, config: Bm25Config) -> None:
        from bm25s.stopwords import STOPWORDS_EN

        self._split = re.compile(r"(?u)\b\w\w+\b").findall
        self._stop = frozenset(STOPWORDS_EN) if config.stopwords == "en" else frozenset()
        self._stem = None
        self._cache: dict[str, str] = {}
        if config.stemmer:
            try:
                import Stemmer
            except ImportError as e:  # index built with stemming, reader without PyStemmer
                raise ImportError(
                    f"this index uses the {config.stemmer!r} stemmer: pip install PyStemmer"
                ) from e
            self._stem = Stemmer.Stemmer(config.stemmer).stemWord

    def __call__(self, text: str) -> list[str]:
        toks = [t for t in self._split(text.lower()) if t not in self._stop]
        if self._stem is None:
            return toks
        out = []
        for t in toks:
            s = self._cache.get(t)
            if s is None:
                s = self._stem(t)
                if len(self._cache) < 200_000:
                    self._cache[t] = s
            out.append(s)
        return out


def build_bm25(chunks: Sequence[Chunk], config: Bm25Config) -> Any:
    import bm25s

    tok = Bm25Tokenizer(config)
    corpus_tokens = [tok(c.indexed_text) for c in chunks]
    retriever = bm25s.BM25(k1=config.k1, b=config.b, method=config.method)
    retriever.index(corpus_tokens, show_progress=False)
    return retriever
