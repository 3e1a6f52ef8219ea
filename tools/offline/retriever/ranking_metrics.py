"""Ranking metrics with the standard (trec_eval / BEIR) definitions, and ROC AUC.

`ranked` is a list of document ids, best first; `qrels` maps document id -> graded
relevance (> 0 is relevant). nDCG uses linear gain (rel) and a log2(rank + 1)
discount, as trec_eval's ndcg_cut and BEIR do. Duplicate ids in a ranking count once,
at their first position (several chunks of one document must not add gain twice).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np


def _dedupe(ranked: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for d in ranked:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def dcg_at_k(gains: Sequence[float], k: int) -> float:
    return sum(g / math.log2(i + 2) for i, g in enumerate(gains[:k]))


def ndcg_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int = 10) -> float:
    ideal = sorted((r for r in qrels.values() if r > 0), reverse=True)
    idcg = dcg_at_k(ideal, k)
    if idcg == 0:
        return 0.0
    gains = [max(qrels.get(d, 0), 0) for d in _dedupe(ranked)[:k]]
    return dcg_at_k(gains, k) / idcg


def recall_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int = 10) -> float:
    relevant = {d for d, r in qrels.items() if r > 0}
    if not relevant:
        return 0.0
    return len(relevant.intersection(_dedupe(ranked)[:k])) / len(relevant)


def mrr_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int = 10) -> float:
    for i, d in enumerate(_dedupe(ranked)[:k]):
        if qrels.get(d, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


def evaluate_run(
    run: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, int]], k: int = 10
) -> dict[str, float]:
    """Mean nDCG/Recall/MRR@k over the queries in qrels (a query missing from the run
    scores 0, as in trec_eval with -c)."""
    qids = list(qrels)
    if not qids:
        return {f"ndcg@{k}": 0.0, f"recall@{k}": 0.0, f"mrr@{k}": 0.0}
    n = len(qids)
    return {
        f"ndcg@{k}": sum(ndcg_at_k(run.get(q, []), qrels[q], k) for q in qids) / n,
        f"recall@{k}": sum(recall_at_k(run.get(q, []), qrels[q], k) for q in qids) / n,
        f"mrr@{k}": sum(mrr_at_k(run.get(q, []), qrels[q], k) for q in qids) / n,
    }


def roc_auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Probability that a random positive scores higher than a random negative
    (Mann-Whitney U with average ranks, so ties count one half). NaN when a class is
    empty."""
    s = np.asarray(scores, dtype=np.float64)
    pos = np.asarray(labels, dtype=bool)
    n_pos = int(pos.sum())
    n_neg = len(s) - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s), dtype=np.float64)
    ranks[order] = np.arange(1, len(s) + 1)
    _, inv = np.unique(s, return_inverse=True)  # average the ranks of tied values
    ranks = (np.bincount(inv, weights=ranks) / np.bincount(inv))[inv]
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
