"""Reciprocal Rank Fusion: one of the hybrid's fusions (`fusion`), and the fused score
of the first hit that the relevance check reads (`SearchResult.rrf_top1`)."""

from __future__ import annotations

# RRF constant 60 as in Cormack et al. 2009; 100 candidates per method before fusion.
RRF_K = 60
CANDIDATE_DEPTH = 100


def rrf(
    rankings: list[list[str]], k: int = RRF_K, weights: list[float] | None = None
) -> list[tuple[str, float]]:
    """Reciprocal Rank Fusion: score(d) = sum_m w_m / (k + rank_m(d)), ranks from 1.

    A document absent from a ranking gets nothing from it; a repeated id within one
    ranking counts once, at its best rank. Ties are broken by the best single rank,
    then by id, so equal inputs always give the same order.
    """
    if weights is None:
        weights = [1.0] * len(rankings)
    if len(weights) != len(rankings):
        raise ValueError(f"{len(weights)} weights for {len(rankings)} rankings")
    scores: dict[str, float] = {}
    best: dict[str, int] = {}
    for w, ranking in zip(weights, rankings, strict=True):
        seen: set[str] = set()
        for rank, doc in enumerate(ranking, start=1):
            if doc in seen:
                continue
            seen.add(doc)
            scores[doc] = scores.get(doc, 0.0) + w / (k + rank)
            best[doc] = min(best.get(doc, rank), rank)
    return sorted(scores.items(), key=lambda kv: (-kv[1], best[kv[0]], kv[0]))
