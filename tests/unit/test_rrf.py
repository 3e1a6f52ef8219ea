"""Reciprocal Rank Fusion arithmetic against hand-computed values."""

import pytest

from services.retriever.rrf import rrf

A = ["d1", "d2", "d3"]
B = ["d3", "d1", "d4"]


def test_unweighted_hand_computed() -> None:
    fused = dict(rrf([A, B], k=60))
    assert fused["d1"] == pytest.approx(1 / 61 + 1 / 62)
    assert fused["d3"] == pytest.approx(1 / 63 + 1 / 61)
    assert fused["d2"] == pytest.approx(1 / 62)
    assert fused["d4"] == pytest.approx(1 / 63)
    assert [d for d, _ in rrf([A, B], k=60)] == ["d1", "d3", "d2", "d4"]


def test_weights_change_the_order() -> None:
    fused = rrf([A, B], k=60, weights=[1.0, 3.0])
    scores = dict(fused)
    assert scores["d1"] == pytest.approx(1 / 61 + 3 / 62)  # 0.064780
    assert scores["d3"] == pytest.approx(1 / 63 + 3 / 61)  # 0.065053
    assert scores["d4"] == pytest.approx(3 / 63)
    assert [d for d, _ in fused] == ["d3", "d1", "d4", "d2"]
    # Doubling the first list keeps d1 ahead: 2/61 + 1/62 > 2/63 + 1/61.
    assert [d for d, _ in rrf([A, B], k=60, weights=[2.0, 1.0])][:2] == ["d1", "d3"]


def test_k_constant() -> None:
    assert dict(rrf([["x"]], k=0))["x"] == pytest.approx(1.0)
    assert dict(rrf([["x", "y"]], k=10))["y"] == pytest.approx(1 / 12)


def test_deterministic_tie_breaking() -> None:
    # x and y get 1/61 + 1/62 each, both with best rank 1: ordered by id.
    assert [d for d, _ in rrf([["y", "x"], ["x", "y"]])] == ["x", "y"]
    assert [d for d, _ in rrf([["x", "y"], ["y", "x"]])] == ["x", "y"]
    # Same score (1/61), independent of the order of the input lists.
    assert rrf([["b"], ["a"]]) == rrf([["a"], ["b"]])


def test_duplicates_in_one_ranking_count_once() -> None:
    assert dict(rrf([["a", "a", "b"]]))["a"] == pytest.approx(1 / 61)
    assert dict(rrf([["a", "a", "b"]]))["b"] == pytest.approx(1 / 63)


def test_edge_cases() -> None:
    assert rrf([]) == []
    assert rrf([[], []]) == []
    with pytest.raises(ValueError, match="1 weights for 2 rankings"):
        rrf([A, B], weights=[1.0])
