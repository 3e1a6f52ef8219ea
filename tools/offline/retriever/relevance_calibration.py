"""Calibration of the relevance check (ADR-0009 Decision 2): how well each signal of
`services.retriever.relevance` tells queries whose context is useless (nDCG@10 == 0)
from the rest, the threshold that separates them best, and what the one reformulation
retry does on the queries it fires on. Its output is what `relevance.THRESHOLDS` and
`SIGNAL_AUC` record."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from offline.retriever.beir import load_qrels, load_queries
from offline.retriever.evaluation import doc_ranking, open_index, sentence_transformer
from offline.retriever.ranking_metrics import ndcg_at_k, roc_auc
from services.retriever.reformulate import reformulate_with_hint
from services.retriever.relevance import SIGNALS, relevance_signal
from services.retriever.rrf import rrf
from shared.encoders.embeddings import Encoder


def calibrate(signals: Sequence[float], labels: Sequence[bool]) -> tuple[float, float]:
    """Pick the threshold below which the check fires.

    `labels[i]` is True when query i had irrelevant context (nDCG@10 == 0). Returns
    (threshold, auc) where auc = P(signal of a good query > signal of a bad one); the
    threshold maximises Youden's J (TPR - FPR) of "fires <=> bad".
    """
    pairs = [(s, bool(y)) for s, y in zip(signals, labels, strict=True) if not math.isnan(s)]
    if not pairs:
        raise ValueError("no finite signals")
    s = np.array([p[0] for p in pairs], dtype=np.float64)
    bad = np.array([p[1] for p in pairs])
    n_bad, n_good = int(bad.sum()), int((~bad).sum())
    if n_bad == 0 or n_good == 0:
        raise ValueError("need both classes to calibrate")
    auc = roc_auc(s.tolist(), (~bad).tolist())

    uniq = np.unique(s)
    # Candidate cut-offs between consecutive values, plus one above the maximum.
    cands = np.concatenate([(uniq[:-1] + uniq[1:]) / 2, [uniq[-1] + 1e-9]])
    best_t, best_v = float(cands[0]), -math.inf
    for t in cands:
        fires = s < t
        v = int((fires & bad).sum()) / n_bad - int((fires & ~bad).sum()) / n_good
        if v > best_v:
            best_t, best_v = float(t), v
    return best_t, auc


def relevance_report(
    corpus: Path,
    queries: Path,
    qrels: Path,
    index_dir: Path | None = None,
    *,
    encoder: Encoder | None = None,
    strategies: Sequence[str] = ("broaden", "prf", "both"),
    signal: str | None = None,
    threshold: float | None = None,
    folds: int = 5,
    progress: bool = True,
) -> dict[str, Any]:
    """AUC of each relevance signal for telling nDCG@10 == 0 queries from the rest
    (hybrid retrieval), the calibrated threshold of the best one, how often it fires,
    and what the one reformulation retry does to nDCG@10 on the queries it fires on."""
    from shared.encoders.embeddings import pin_threads

    pin_threads(1)
    enc = encoder if encoder is not None else sentence_transformer()
    index, _ = open_index(corpus, index_dir, enc, progress)
    judged = load_qrels(qrels)
    qs = load_queries(queries, set(judged))

    qids = list(qs)
    results = {q: index.search(qs[q], 10, "hybrid") for q in qids}
    ndcg = np.array([ndcg_at_k(doc_ranking(results[q], 10), judged[q]) for q in qids])
    bad = ndcg == 0
    sig = {name: np.array([relevance_signal(results[q], name) for q in qids])
           for name in SIGNALS}

    per_signal: dict[str, Any] = {}
    for name, vals in sig.items():
        ok = ~np.isnan(vals)
        thr, auc = calibrate(vals[ok].tolist(), bad[ok].tolist())
        fires = vals < thr
        per_signal[name] = {
            "auc": auc,
            "youden_threshold": thr,
            "fire_rate": float(fires.mean()),
            "tpr": float((fires & bad).sum() / bad.sum()),
            "fpr": float((fires & ~bad).sum() / (~bad).sum()),
        }
    chosen = signal or max(per_signal, key=lambda s: per_signal[s]["auc"])
    thr = threshold if threshold is not None else per_signal[chosen]["youden_threshold"]
    vals = sig[chosen]
    fires = vals < thr

    # Out-of-fold check of the threshold (the in-sample J is optimistic).
    rng = np.random.default_rng(0)
    fold_of = rng.permutation(len(qids)) % folds
    oof_fire = np.zeros(len(qids), dtype=bool)
    for f in range(folds):
        tr = fold_of != f
        t_f, _ = calibrate(vals[tr].tolist(), bad[tr].tolist())
        oof_fire[~tr] = vals[~tr] < t_f
    cv = {
        "folds": folds,
        "fire_rate": float(oof_fire.mean()),
        "tpr": float((oof_fire & bad).sum() / bad.sum()),
        "fpr": float((oof_fire & ~bad).sum() / (~bad).sum()),
    }

    retry: dict[str, Any] = {}
    fired_ids = [q for q, f in zip(qids, fires, strict=True) if f]
    base = {q: n for q, n in zip(qids, ndcg, strict=True)}
    for strategy in strategies:
        deltas: dict[str, list[float]] = {"replace": [], "fuse": []}
        for q in fired_ids:
            first = results[q]
            new_q = reformulate_with_hint(qs[q], first.passages[:3], strategy=strategy)
            second = doc_ranking(index.search(new_q, 10, "hybrid"), 10)
            # "replace" is ADR-0009 as written (generate on the second retrieval);
            # "fuse" keeps what the first retrieval found and lets the retry add to it.
            fused = [d for d, _ in rrf([doc_ranking(first, 10), second])][:10]
            deltas["replace"].append(ndcg_at_k(second, judged[q]) - base[q])
            deltas["fuse"].append(ndcg_at_k(fused, judged[q]) - base[q])
        for mode, values in deltas.items():
            d = np.array(values)
            retry[f"{strategy}/{mode}"] = {
                "fired": len(d),
                "improved": float((d > 1e-9).mean()) if len(d) else 0.0,
                "worse": float((d < -1e-9).mean()) if len(d) else 0.0,
                "unchanged": float((np.abs(d) <= 1e-9).mean()) if len(d) else 0.0,
                "mean_delta_ndcg": float(d.mean()) if len(d) else 0.0,
                "ndcg_all_queries_after": float(
                    (ndcg.sum() + d.sum()) / len(qids)) if len(d) else float(ndcg.mean()),
            }
    return {
        "queries": len(qids),
        "hybrid_ndcg@10": float(ndcg.mean()),
        "share_ndcg0": float(bad.mean()),
        "signals": per_signal,
        "chosen_signal": chosen,
        "threshold": thr,
        "fire_rate": float(fires.mean()),
        "fired_precision": float((fires & bad).sum() / max(1, fires.sum())),
        "cross_validated": cv,
        "retry": retry,
    }
