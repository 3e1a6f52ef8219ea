"""How the hybrid merges its BM25 and dense hits (ADR-0003 hybrid retrieval): the
settings both backends share, and the two fusions they offer.

"score" (the default) adds each method's scores divided by that method's best score,
times its weight: BM25's scale moves with the corpus and the query's length, a
cosine's does not, and dividing by the top hit puts both on "1 = as good as this
query's best". "rrf" is Reciprocal Rank Fusion (`rrf.rrf`).

Measured on SciFact (all-MiniLM-L6-v2, bm25s k1=1.2 b=0.75 Snowball, 100 hits per
method): nDCG@10 with each fusion's parameters chosen by 5-fold cross-validation over
the 809 train queries (4 shuffles; `python -m bench.retrieval fusion-cv`), then on the
300 test queries, which chose nothing:

    fusion                              train CV   train    test
    rrf k=60, weights 1:1 (untuned)        -       0.715    0.712   the previous default
    rrf, k and BM25 weight by CV         0.730     0.730    0.714   k=1 picked 20/20 folds
    score, BM25 weight by CV (shipped)   0.736     0.738    0.733   1:1 picked 18/20 folds

Measured apart with the same protocol: min-max normalisation per list (CV 0.731, test
0.724) and z-scores (0.732, 0.732) do no better; raw BM25 x c + cosine (0.738, 0.736)
does as well, but c is in units of SciFact's BM25 scores. BM25 title boosting with
other k1/b (+0.003 CV, +0.002 test) and dense pseudo-relevance feedback (+0.001 CV,
-0.002 test) were within noise: a test figure's standard error is 0.021.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence

import msgspec

from services.retriever.rrf import CANDIDATE_DEPTH, RRF_K, rrf


class Fusion(enum.StrEnum):
    SCORE = "score"
    RRF = "rrf"


class FusionSettings(msgspec.Struct, frozen=True):
    """The hybrid's fusion. Weights are BM25's and the dense method's; `rrf_k` is used
    by "rrf" only; `depth` hits per method are fused."""

    method: Fusion = Fusion.SCORE
    rrf_k: int = RRF_K
    bm25_weight: float = 1.0
    dense_weight: float = 1.0
    depth: int = CANDIDATE_DEPTH


# The score of a document a method's hits lack, when the backend can tell it (the
# embedded index scores every chunk); None: the lowest score among that method's hits.
Lookup = Callable[[str], float] | None


def score_fusion(
    hits: Sequence[Mapping[str, float]],
    weights: Sequence[float],
    lookups: Sequence[Lookup] | None = None,
) -> list[tuple[str, float]]:
    """score(d) = sum_m w_m * s_m(d) / max(s_m), over every document any method found.

    `hits[m]` maps document id -> method m's score. A document m did not return scores
    `lookups[m](id)` when given, else m's lowest returned score (it ranked below all of
    them). A method whose best score is not positive (BM25 matching no query term)
    adds nothing. Ties are broken by id, so equal inputs always give the same order.
    """
    if len(weights) != len(hits):
        raise ValueError(f"{len(weights)} weights for {len(hits)} score lists")
    look = list(lookups) if lookups is not None else [None] * len(hits)
    if len(look) != len(hits):
        raise ValueError(f"{len(look)} lookups for {len(hits)} score lists")
    docs: dict[str, None] = {}
    for h in hits:
        docs.update(dict.fromkeys(h))
    scores = dict.fromkeys(docs, 0.0)
    for w, h, lookup in zip(weights, hits, look, strict=True):
        if not h:
            continue
        top = max(h.values())
        if top <= 0:
            continue
        floor = min(h.values())
        for d in docs:
            s = h.get(d)
            if s is None:
                s = lookup(d) if lookup is not None else floor
            scores[d] += w * s / top
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))


def fuse(
    hits: Sequence[Mapping[str, float]],
    settings: FusionSettings,
    extra_weights: Sequence[float] = (),
    lookups: Sequence[Lookup] | None = None,
) -> list[tuple[str, float]]:
    """The hybrid's order of `hits` = [BM25's, dense's, *extra lists], each id -> score
    with the best first, by `settings`' fusion (extra lists are weighted by
    `extra_weights`)."""
    weights = [settings.bm25_weight, settings.dense_weight, *extra_weights]
    if settings.method == Fusion.RRF:
        return rrf([list(h) for h in hits], k=settings.rrf_k, weights=weights)
    return score_fusion(hits, weights, lookups)
