"""`intentroute eval cache PAIRS.jsonl`: the answer cache's live matching decision
(`shared.cache.match.decide`) on labelled question pairs.

A line is `{"id", "a", "b", "same": true|false, "kind", "type", "lang"}`: `a` the earlier
question (the stored one), `b` the new one, `same` whether `a`'s answer answers `b`,
`kind` what makes the pair (paraphrase, command_swap, negation, ...), `type` the query
type both were routed to, `lang` the language of `b`. The vectors are the classifier's
(the encoder Layer 2 reads every message with first), so the figures are the worker's.

Reported: `hit_rate` over the `same` pairs, `false_hit_rate` over the others, both per
kind, language and type; the reasons of the misses; and per type the sweep of the
cosine threshold (what each threshold would give with the facts checked), which is how
the thresholds in `shared.cache.match` were chosen.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from shared.cache.facts import facts
from shared.cache.match import decide, thresholds_for
from shared.contracts.routing import QueryType
from shared.encoders.embeddings import Encoder

SWEEP = tuple(round(0.5 + 0.05 * i, 2) for i in range(10))


class Pair(msgspec.Struct, frozen=True):
    id: str
    a: str
    b: str
    same: bool
    kind: str
    type: QueryType
    lang: str


def load_pairs(path: Path) -> list[Pair]:
    pairs = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                pairs.append(msgspec.json.decode(line, type=Pair))
            except msgspec.ValidationError as exc:
                raise ValueError(f"{path}:{n}: {exc}") from None
    return pairs


def _rate(hits: int, n: int) -> float:
    return round(hits / n, 4) if n else 0.0


def _similarities(pairs: list[Pair], encoder: Encoder) -> list[float]:
    texts = sorted({t for p in pairs for t in (p.a, p.b)})
    vectors = np.asarray(encoder.encode(texts, batch_size=32), dtype=np.float32)
    row = {t: i for i, t in enumerate(texts)}
    return [float(vectors[row[p.a]] @ vectors[row[p.b]]) for p in pairs]


def _summary(rows: Iterable[tuple[Pair, bool]]) -> dict[str, Any]:
    same = diff = hits = false_hits = 0
    for pair, hit in rows:
        if pair.same:
            same += 1
            hits += hit
        else:
            diff += 1
            false_hits += hit
    return {"hit_rate": _rate(hits, same), "false_hit_rate": _rate(false_hits, diff),
            "same": same, "different": diff, "hits": hits, "false_hits": false_hits}


def evaluate(pairs: list[Pair], encoder: Encoder, *,
             layers: int | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The figures (module doc) and one prediction per pair."""
    thresholds = thresholds_for(layers)
    sims = _similarities(pairs, encoder)
    predictions: list[dict[str, Any]] = []
    outcomes: list[tuple[Pair, bool]] = []
    reasons: Counter[str] = Counter()
    agrees: list[bool] = []
    for pair, sim in zip(pairs, sims, strict=True):
        fa, fb = facts(pair.a), facts(pair.b)
        verdict = decide(fa, fb, sim, pair.type, thresholds)
        outcomes.append((pair, verdict.hit))
        if not verdict.hit:
            reasons[verdict.reason] += 1
        agrees.append(verdict.hit or verdict.reason == "similarity")
        predictions.append({"id": pair.id, "hit": verdict.hit, "same": pair.same,
                            "similarity": round(sim, 4), "reason": verdict.reason,
                            "kind": pair.kind, "type": pair.type.value, "lang": pair.lang})
    by: dict[str, dict[str, list[tuple[Pair, bool]]]] = {
        "kind": defaultdict(list), "lang": defaultdict(list), "type": defaultdict(list)}
    for pair, hit in outcomes:
        by["kind"][pair.kind].append((pair, hit))
        by["lang"][pair.lang].append((pair, hit))
        by["type"][pair.type.value].append((pair, hit))
    by_kind = {}
    for kind, rows in sorted(by["kind"].items()):
        s = _summary(rows)
        by_kind[kind] = ({"n": s["same"], "hits": s["hits"], "hit_rate": s["hit_rate"]}
                         if rows[0][0].same else
                         {"n": s["different"], "hits": s["false_hits"],
                          "false_hit_rate": s["false_hit_rate"]})
    report: dict[str, Any] = {
        "pairs": len(pairs),
        **_summary(outcomes),
        "by_kind": by_kind,
        "by_lang": {k: _summary(v) for k, v in sorted(by["lang"].items())},
        "by_type": {k: _summary(v) for k, v in sorted(by["type"].items())},
        "misses_by_reason": dict(reasons.most_common()),
        "thresholds": {t.value: v for t, v in thresholds.items()},
        "encoder": {"model": getattr(encoder, "model_name", type(encoder).__name__),
                    "layers": layers},
        "sweep": _sweep(pairs, sims, agrees),
    }
    return report, predictions


def _sweep(pairs: list[Pair], sims: list[float], agrees: list[bool]) -> dict[str, Any]:
    """Per type and threshold: the hit and false hit rates with the facts checked
    (`with_facts`) and with the cosine alone (`cosine_only`), and the cosines of the
    paraphrases the facts accept (the thresholds are their 10th percentile)."""
    out: dict[str, Any] = {}
    for qt in sorted({p.type for p in pairs}):
        rows = [(p, s, a) for p, s, a in zip(pairs, sims, agrees, strict=True) if p.type is qt]
        same = sum(p.same for p, _, _ in rows)
        diff = len(rows) - same

        def curve(need_facts: bool, rows: list[tuple[Pair, float, bool]] = rows,
                  same: int = same, diff: int = diff) -> list[dict[str, float]]:
            points = []
            for threshold in SWEEP:
                taken = [p for p, s, a in rows if s >= threshold and (a or not need_facts)]
                points.append({"threshold": threshold,
                               "hit_rate": _rate(sum(p.same for p in taken), same),
                               "false_hit_rate": _rate(sum(not p.same for p in taken), diff)})
            return points

        accepted = sorted(s for p, s, a in rows if p.same and a)
        out[qt.value] = {
            "with_facts": curve(True), "cosine_only": curve(False),
            "paraphrase_cosine_p10": round(accepted[len(accepted) // 10], 4) if accepted else None,
            "paraphrase_cosine_p50": round(accepted[len(accepted) // 2], 4) if accepted else None,
        }
    return out


def write_predictions(path: Path, predictions: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in predictions:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
