"""Discriminative context-relevance check (ADR-0009 Decision 2, Future Path).

Replaces the LLM YES/NO call with a score computed from what retrieval already has
(query vector, passage vectors, dense/BM25/RRF scores): microseconds, no extra model.
The check only decides whether to spend the single reformulation retry (RC-08).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from services.retriever.ports import SearchResult

TOP_N = 8  # the generator sees 8 passages; signals look at the same ones


def _top1_dense(r: SearchResult) -> float:
    return float(r.dense_top1)


def _mean_topk_cosine(r: SearchResult) -> float:
    s = r.dense_scores[:TOP_N]
    return float(np.mean(s)) if s else math.nan


def _centroid_cosine(r: SearchResult) -> float:
    """The seed's formula: cosine(query, mean(embed(chunks)))."""
    if r.query_vector is None or r.passage_vectors is None or len(r.passage_vectors) == 0:
        return math.nan
    centroid = np.asarray(r.passage_vectors[:TOP_N], dtype=np.float32).mean(axis=0)
    norm = float(np.linalg.norm(centroid) * np.linalg.norm(r.query_vector))
    return float(centroid @ r.query_vector) / norm if norm else math.nan


def _dense_margin(r: SearchResult) -> float:
    """How far the best dense hit stands out from the passages handed over."""
    s = r.dense_scores[:TOP_N]
    return float(r.dense_top1 - np.mean(s)) if s else math.nan


def _top1_bm25(r: SearchResult) -> float:
    return float(r.bm25_top1)


def _bm25_peak(r: SearchResult) -> float:
    """BM25 top-1 over the mean BM25 score of the returned passages: scale-free
    (raw BM25 grows with query length), high when one passage matches clearly."""
    s = [x for x in r.bm25_scores[:TOP_N] if x > 0]
    return float(r.bm25_top1 / np.mean(s)) if s else 0.0


def _rrf_top1(r: SearchResult) -> float:
    """RRF score of the first passage: 2/61 when BM25 and dense agree on it (a backend
    that does not say it: the passage's score, an RRF score there)."""
    if not r.passages or r.method != "hybrid":
        return math.nan
    return float(r.rrf_top1) if not math.isnan(r.rrf_top1) else float(r.passages[0].score)


# Logistic model over three scale-free signals (bounded cosine, BM25 ratio, RRF score
# x 61 so "first in one list" = 1): fitted on SciFact train (809 queries, target
# nDCG@10 > 0) with scikit-learn LogisticRegression(C=1); 5-fold CV AUC 0.811 against
# 0.776 for the best single signal. Raw BM25 is left out on purpose: its scale moves
# with the corpus and query length, so a threshold on it does not transfer to the KB.
COMBINED_WEIGHTS = {"top1_dense": 2.741, "bm25_peak": 2.564, "rrf_top1_x61": 2.954}
COMBINED_BIAS = -9.693


def _combined(r: SearchResult) -> float:
    """Log-odds that the context is good (needs a hybrid result)."""
    rrf = _rrf_top1(r)
    if math.isnan(rrf) or math.isnan(r.dense_top1):
        return math.nan
    return (
        COMBINED_WEIGHTS["top1_dense"] * r.dense_top1
        + COMBINED_WEIGHTS["bm25_peak"] * _bm25_peak(r)
        + COMBINED_WEIGHTS["rrf_top1_x61"] * 61.0 * rrf
        + COMBINED_BIAS
    )


SIGNALS: dict[str, Callable[[SearchResult], float]] = {
    "top1_dense": _top1_dense,
    "mean_topk_cosine": _mean_topk_cosine,
    "centroid_cosine": _centroid_cosine,
    "dense_margin": _dense_margin,
    "top1_bm25": _top1_bm25,
    "bm25_peak": _bm25_peak,
    "rrf_top1": _rrf_top1,
    "combined": _combined,
}

# Calibrated on SciFact train (809 queries, hybrid top-10, all-MiniLM-L6-v2, bm25s
# k1=1.2 b=0.75 Snowball) with `python -m bench.retrieval relevance`
# (`offline.retriever.relevance_calibration`): positives = the 115 queries (14.2%) with
# nDCG@10 == 0; each threshold maximises Youden's J. AUC = P(signal of a good query >
# signal of a bad one). The seed's centroid cosine (0.559) and mean top-8 cosine
# (0.571) barely separate; "combined" does best. Those figures are of the RRF hybrid;
# with the score fusion (`fusion.py`) the first passage's RRF score is lower more
# often, so "combined" was recalibrated on its hits (same command, same weights).
SIGNAL_AUC = {
    "combined": 0.815,  # score-fused hybrid; RRF hybrid: 0.820, 5-fold CV of the fit 0.811
    "top1_bm25": 0.776,
    "bm25_peak": 0.743,
    "rrf_top1": 0.720,
    "dense_margin": 0.705,
    "top1_dense": 0.677,
    "mean_topk_cosine": 0.571,
    "centroid_cosine": 0.559,
}
THRESHOLDS = {
    # Fires on 41% of queries: TPR 0.82, FPR 0.34 (5-fold CV: 36%, 0.71 / 0.31); the RRF
    # hybrid's 1.681 would fire on 46% here.
    "combined": 1.509,
    "top1_bm25": 11.64,  # SciFact's BM25 scale only: recalibrate per corpus
    "bm25_peak": 1.586,
    "rrf_top1": 0.0320,
    "dense_margin": 0.1125,
    "top1_dense": 0.542,
    "mean_topk_cosine": 0.468,
    "centroid_cosine": 0.672,
}
DEFAULT_SIGNAL = "combined"
DEFAULT_THRESHOLD = THRESHOLDS[DEFAULT_SIGNAL]


def relevance_signal(result: SearchResult, method: str = DEFAULT_SIGNAL) -> float:
    """Higher = more likely the context answers the query. NaN if not computable."""
    try:
        fn = SIGNALS[method]
    except KeyError:
        raise ValueError(f"unknown signal {method!r}; choose from {sorted(SIGNALS)}") from None
    return fn(result)


def is_relevant(signal: float, threshold: float = DEFAULT_THRESHOLD) -> bool:
    """A NaN signal (no vectors) counts as relevant: without evidence, don't retry."""
    return math.isnan(signal) or signal >= threshold


def check_relevance(result: SearchResult, method: str = DEFAULT_SIGNAL,
                    threshold: float | None = None) -> tuple[bool, float]:
    """(relevant?, signal) with the calibrated threshold of `method` by default.

    "combined" needs a hybrid result; for a dense-only result it falls back to
    top1_dense (with that signal's threshold) instead of never firing.
    """
    if method == "combined" and result.method != "hybrid" and threshold is None:
        method = "top1_dense"
    signal = relevance_signal(result, method)
    return is_relevant(signal, THRESHOLDS[method] if threshold is None else threshold), signal
