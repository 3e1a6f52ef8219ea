"""Choosing the hybrid's fusion by cross-validation on a train split (`fusion.py`'s
table): nDCG@10 of each candidate fusion on every train query, then, per fusion,
k-fold CV of "pick the candidate with the best mean on the other folds" (the honest
figure of a tuned fusion: the in-sample best is optimistic). Test queries, when
given, are only scored, never used to choose.

Every candidate runs the shipped search (`EmbeddedIndex.search`), one query vector
per query.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from offline.retriever.beir import load_qrels, load_queries
from offline.retriever.evaluation import doc_ranking, open_index, sentence_transformer
from offline.retriever.ranking_metrics import ndcg_at_k
from services.retriever.fusion import Fusion, FusionSettings
from services.retriever.index import EmbeddedIndex
from shared.encoders.embeddings import Encoder

# RRF: k from Cormack's 60 down to 1 (a small k is "trust the top ranks"), BM25 weight
# around 1. Score fusion: BM25's weight for a dense weight of 1 (share 0.33 .. 0.67).
RRF_GRID = [FusionSettings(method=Fusion.RRF, rrf_k=k, bm25_weight=w)
            for k in (1, 5, 10, 20, 60, 100) for w in (0.8, 1.0, 1.25, 1.5)]
SCORE_GRID = [FusionSettings(method=Fusion.SCORE, bm25_weight=w)
              for w in (0.5, 0.67, 0.82, 1.0, 1.22, 1.5, 2.0)]


def label(f: FusionSettings) -> str:
    if f.method == Fusion.RRF:
        return f"rrf k={f.rrf_k} bm25_weight={f.bm25_weight:g}"
    return f"score bm25_weight={f.bm25_weight:g} dense_weight={f.dense_weight:g}"


def per_query_ndcg(index: EmbeddedIndex, qs: dict[str, str], judged: dict[str, dict[str, int]],
                   candidates: Sequence[FusionSettings], k: int = 10) -> npt.NDArray[np.float64]:
    """(queries x candidates) nDCG@k of each candidate fusion."""
    out = np.zeros((len(qs), len(candidates)))
    for i, (qid, text) in enumerate(qs.items()):
        qv = index.scores(text, "dense").query_vector
        for j, f in enumerate(candidates):
            r = index.search(text, k, "hybrid", query_vector=qv, fusion=f)
            out[i, j] = ndcg_at_k(doc_ranking(r, k), judged[qid], k)
    return out


def nested_cv(scores: npt.NDArray[np.float64], folds: int = 5, repeats: int = 4
              ) -> tuple[float, Counter[int]]:
    """Mean held-out nDCG of the candidate picked on the other folds (queries shuffled
    `repeats` times), and how often each candidate was picked."""
    n = scores.shape[0]
    held_out: list[float] = []
    picks: Counter[int] = Counter()
    for r in range(repeats):
        perm = np.random.default_rng(r).permutation(n)
        for f in range(folds):
            held = perm[f::folds]
            fit = np.setdiff1d(perm, held)
            j = int(np.argmax(scores[fit].mean(axis=0)))
            picks[j] += 1
            held_out.append(float(scores[held, j].mean()))
    return float(np.mean(held_out)), picks


def fusion_cv(
    corpus: Path,
    queries: Path,
    train_qrels: Path,
    test_qrels: Path | None = None,
    index_dir: Path | None = None,
    *,
    encoder: Encoder | None = None,
    folds: int = 5,
    repeats: int = 4,
    progress: bool = True,
) -> dict[str, Any]:
    """Per candidate: train nDCG@10 (and test's); per fusion: nested CV on train, the
    candidate picked on all of train, and that candidate's test nDCG@10."""
    from shared.encoders.embeddings import pin_threads

    pin_threads(1)
    enc = encoder if encoder is not None else sentence_transformer()
    index, _ = open_index(corpus, index_dir, enc, progress)
    reference = FusionSettings(method=Fusion.RRF)
    grids = {"rrf": RRF_GRID, "score": SCORE_GRID}
    candidates = [reference, FusionSettings(), *RRF_GRID, *SCORE_GRID]
    splits = {"train": load_qrels(train_qrels)}
    if test_qrels is not None:
        splits["test"] = load_qrels(test_qrels)
    ndcg: dict[str, npt.NDArray[np.float64]] = {}
    for split, judged in splits.items():
        qs = load_queries(queries, set(judged))
        ndcg[split] = per_query_ndcg(index, qs, {q: judged[q] for q in qs}, candidates)

    def column(f: FusionSettings) -> int:
        return candidates.index(f)

    def figures(j: int) -> dict[str, float]:
        return {split: float(m[:, j].mean()) for split, m in ndcg.items()}

    out: dict[str, Any] = {
        "train_queries": int(ndcg["train"].shape[0]),
        "test_queries": int(ndcg["test"].shape[0]) if "test" in ndcg else 0,
        "plain_rrf": figures(column(reference)),
        "shipped": {"fusion": msgspec.to_builtins(FusionSettings()),
                    **figures(column(FusionSettings()))},
        "candidates": {label(f): figures(column(f)) for f in candidates[2:]},
    }
    for name, grid in grids.items():
        cols = [column(f) for f in grid]
        cv, picks = nested_cv(ndcg["train"][:, cols], folds, repeats)
        best = cols[int(np.argmax(ndcg["train"][:, cols].mean(axis=0)))]
        out[name] = {
            "train_cv": cv,
            "fold_picks": {label(grid[j]): n for j, n in picks.most_common()},
            "picked_on_train": label(candidates[best]),
            **figures(best),
        }
    return out
