"""IR metrics against a hand-computed example; relevance calibration."""

import math

import pytest

from offline.retriever.ranking_metrics import (
    evaluate_run,
    mrr_at_k,
    ndcg_at_k,
    recall_at_k,
    roc_auc,
)
from offline.retriever.relevance_calibration import calibrate
from services.retriever.relevance import is_relevant

QRELS = {"d1": 2, "d2": 1, "d3": 1}
RANKED = ["d4", "d1", "d5", "d2"]


def test_ndcg_hand_computed() -> None:
    # DCG  = 2/log2(3) + 1/log2(5)             = 1.261860 + 0.430677 = 1.692537
    # IDCG = 2/log2(2) + 1/log2(3) + 1/log2(4) = 2 + 0.630930 + 0.5   = 3.130930
    assert ndcg_at_k(RANKED, QRELS, 10) == pytest.approx(1.692537 / 3.130930, abs=1e-6)
    # @2: DCG = 1.261860, IDCG = 2 + 0.630930
    assert ndcg_at_k(RANKED, QRELS, 2) == pytest.approx(1.261860 / 2.630930, abs=1e-6)
    assert ndcg_at_k(["d1", "d2", "d3"], QRELS, 10) == pytest.approx(1.0)
    assert ndcg_at_k(["d9"], QRELS, 10) == 0.0
    assert ndcg_at_k(["d1"], {}, 10) == 0.0


def test_recall_and_mrr() -> None:
    assert recall_at_k(RANKED, QRELS, 10) == pytest.approx(2 / 3)
    assert recall_at_k(RANKED, QRELS, 2) == pytest.approx(1 / 3)
    assert mrr_at_k(RANKED, QRELS, 10) == pytest.approx(1 / 2)
    assert mrr_at_k(RANKED, QRELS, 1) == 0.0
    assert mrr_at_k(["d9", "d8", "d3"], QRELS, 10) == pytest.approx(1 / 3)


def test_duplicates_count_once() -> None:
    # Several chunks of one document must not add gain twice.
    assert ndcg_at_k(["d1", "d1", "d2"], QRELS, 10) == ndcg_at_k(["d1", "d2"], QRELS, 10)
    assert mrr_at_k(["d4", "d4", "d2"], QRELS, 10) == pytest.approx(1 / 2)


def test_zero_grades_are_not_relevant() -> None:
    q = {"a": 0, "b": 1}
    assert recall_at_k(["a"], q, 10) == 0.0
    assert mrr_at_k(["a", "b"], q, 10) == pytest.approx(0.5)


def test_evaluate_run_means_over_qrels() -> None:
    run = {"q1": RANKED}  # q2 is judged but missing from the run: scores 0
    res = evaluate_run(run, {"q1": QRELS, "q2": {"x": 1}}, 10)
    assert res["recall@10"] == pytest.approx((2 / 3) / 2)
    assert res["mrr@10"] == pytest.approx(0.25)


def test_auc_and_calibration() -> None:
    assert roc_auc([0.1, 0.4, 0.35, 0.8], [False, False, True, True]) == pytest.approx(0.75)
    assert math.isnan(roc_auc([1.0], [True]))
    signals = [0.1, 0.2, 0.3, 0.8, 0.9]
    bad = [True, True, False, False, False]
    threshold, auc = calibrate(signals, bad)
    assert auc == pytest.approx(1.0)
    assert 0.2 < threshold <= 0.3
    assert not is_relevant(0.15, threshold)
    assert is_relevant(0.85, threshold)
    assert is_relevant(math.nan, threshold)  # no evidence: don't retry
    # Ties count one half: one good and one bad query with the same signal.
    assert roc_auc([0.5, 0.5], [False, True]) == 0.5
    with pytest.raises(ValueError, match="need both classes"):
        calibrate([0.1, 0.2], [True, True])


def test_relevance_signals_from_a_search_result() -> None:
    import numpy as np

    from services.retriever.ports import SearchResult
    from services.retriever.relevance import check_relevance, relevance_signal
    from shared.contracts.pipeline import Passage

    q = np.array([1.0, 0.0], dtype=np.float32)
    pv = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    res = SearchResult(
        passages=[Passage("a", "", "x", 2 / 61), Passage("b", "", "y", 1 / 62)],
        method="hybrid", query_vector=q, passage_vectors=pv, dense_top1=1.0,
        dense_scores=[1.0, 0.0], bm25_top1=6.0, bm25_scores=[6.0, 2.0],
    )
    assert relevance_signal(res, "top1_dense") == 1.0
    assert relevance_signal(res, "mean_topk_cosine") == pytest.approx(0.5)
    # cosine(q, mean(pv)) = 0.5 / |(0.5, 0.5)| = 1/sqrt(2)
    assert relevance_signal(res, "centroid_cosine") == pytest.approx(2 ** -0.5, abs=1e-6)
    assert relevance_signal(res, "dense_margin") == pytest.approx(0.5)
    assert relevance_signal(res, "bm25_peak") == pytest.approx(6.0 / 4.0)
    assert relevance_signal(res, "rrf_top1") == pytest.approx(2 / 61)
    # A score-fused hybrid says its first passage's RRF score apart from its own score.
    fused = SearchResult(passages=[Passage("a", "", "x", 2.0)], method="hybrid",
                         rrf_top1=1 / 61 + 1 / 62)
    assert relevance_signal(fused, "rrf_top1") == pytest.approx(1 / 61 + 1 / 62)
    # 2.741 * 1 + 2.564 * 1.5 + 2.954 * 2 - 9.693
    assert relevance_signal(res, "combined") == pytest.approx(2.802, abs=1e-3)
    ok, signal = check_relevance(res)
    assert ok
    assert signal == relevance_signal(res, "combined")
    bm25_only = SearchResult(passages=res.passages, method="bm25", bm25_top1=6.0)
    assert math.isnan(relevance_signal(bm25_only, "combined"))
    assert check_relevance(bm25_only)[0]  # no evidence: no retry
    dense_only = SearchResult(passages=res.passages, method="dense", dense_top1=0.3)
    assert check_relevance(dense_only) == (False, 0.3)  # falls back to top1_dense < 0.542
    with pytest.raises(ValueError, match="unknown signal"):
        relevance_signal(res, "llm")
