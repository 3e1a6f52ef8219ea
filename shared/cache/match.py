"""The cache's matching decision: may the stored answer to question `a` serve question `b`?

Both are of the same agent's scope, query type, language, model slot and model (the
index keys on those before it compares anything). Then `b` is served `a`'s answer only
when
1. `b` has something to match on (`matchable`: a command, an identifier, a number, a URL
   or a content word; "how do I do it?" never matches anything),
2. the cosine of the two questions' sentence vectors reaches the query type's threshold
   (`THRESHOLDS`), and
3. their facts agree (`shared.cache.facts.disagreement`): the same commands,
   identifiers, numbers, URLs, negation, content words and directions.

The vectors are the ones Layer 2 of the classifier computes first for every message
(with the shipped head: the encoder's embedding module alone, "layer 0"); a head
without an early exit gives the full encoder's, which `THRESHOLDS_FULL` is for. The
thresholds were chosen on tests/data/cache_pairs.jsonl (the figures:
docs/explanation/answer-cache.md): the 10th percentile of the cosine of the paraphrases
whose facts agree, per type, rounded down to 0.05. The facts alone missed every hard
negative of the set; the cosine is the margin for what they cannot see, and alone it
separates nothing (the hard negatives' median cosine is the paraphrases').
"""

from __future__ import annotations

import msgspec

from shared.cache.facts import Facts, disagreement
from shared.contracts.routing import QueryType

# Layer-0 vectors (the shipped head's early exit) and the full encoder's.
# Paraphrase cosine p10 on the set: layer 0 RETRIEVAL 0.700, CODE_GENERATION 0.902;
# full encoder (int8) 0.827 and 0.918.
THRESHOLDS: dict[QueryType, float] = {
    QueryType.RETRIEVAL: 0.70,
    QueryType.CODE_GENERATION: 0.90,
}
THRESHOLDS_FULL: dict[QueryType, float] = {
    QueryType.RETRIEVAL: 0.80,
    QueryType.CODE_GENERATION: 0.90,
}
# Reasons a candidate is not served, besides a fact that differs.
EMPTY = "empty"
SIMILARITY = "similarity"
UNCACHED_TYPE = "type"


def thresholds_for(layers: int | None) -> dict[QueryType, float]:
    """The thresholds of vectors from an encoder keeping `layers` layers (0: the
    embedding module alone; None: all of them)."""
    return THRESHOLDS if layers == 0 else THRESHOLDS_FULL


def matchable(f: Facts) -> bool:
    """Does the question say anything a match could be checked on?"""
    return bool(f.commands or f.identifiers or f.numbers or f.urls or f.terms)


class Verdict(msgspec.Struct, frozen=True):
    hit: bool
    # Why not ("" on a hit): EMPTY, SIMILARITY, UNCACHED_TYPE or the fact that differs.
    reason: str = ""


def decide(a: Facts, b: Facts, similarity: float, query_type: QueryType,
           thresholds: dict[QueryType, float] = THRESHOLDS) -> Verdict:
    """The live decision for the stored question `a` and the new question `b`."""
    threshold = thresholds.get(query_type)
    if threshold is None:
        return Verdict(False, UNCACHED_TYPE)
    if not matchable(b):
        return Verdict(False, EMPTY)
    differs = disagreement(a, b)
    if differs:
        return Verdict(False, differs)
    if similarity < threshold:
        return Verdict(False, SIMILARITY)
    return Verdict(True)
