"""The hybrid's score fusion against hand-computed values, and `fuse` choosing between
it and RRF as the settings say."""

import pytest

from services.retriever.fusion import Fusion, FusionSettings, fuse, score_fusion
from services.retriever.rrf import rrf

# BM25 scores grow with the query (here 20 at the top); cosines stay below 1.
BM25 = {"a": 20.0, "b": 10.0, "c": 5.0}
DENSE = {"c": 0.8, "d": 0.56, "a": 0.4}


def test_each_method_is_divided_by_its_best_score() -> None:
    fused = dict(score_fusion([BM25, DENSE], [1.0, 1.0]))
    assert fused["a"] == pytest.approx(20 / 20 + 0.4 / 0.8)
    assert fused["c"] == pytest.approx(5 / 20 + 0.8 / 0.8)
    # Missing from a method's hits: that method's lowest returned score.
    assert fused["b"] == pytest.approx(10 / 20 + 0.4 / 0.8)
    assert fused["d"] == pytest.approx(5 / 20 + 0.56 / 0.8)
    assert [d for d, _ in score_fusion([BM25, DENSE], [1.0, 1.0])] == ["a", "c", "b", "d"]


def test_the_scale_of_bm25_does_not_matter() -> None:
    tenfold = score_fusion([{d: 10 * s for d, s in BM25.items()}, DENSE], [1.0, 1.0])
    once = score_fusion([BM25, DENSE], [1.0, 1.0])
    assert [d for d, _ in tenfold] == [d for d, _ in once]
    assert [s for _, s in tenfold] == pytest.approx([s for _, s in once])


def test_weights_and_lookups() -> None:
    # The dense weight 3 lifts c (best cosine) over a (best BM25).
    assert [d for d, _ in score_fusion([BM25, DENSE], [1.0, 3.0])][:2] == ["c", "a"]
    known = {"b": 0.1, "d": 0.0}
    fused = dict(score_fusion([BM25, DENSE], [1.0, 1.0],
                              [lambda d: 0.0, lambda d: known[d]]))
    assert fused["b"] == pytest.approx(10 / 20 + 0.1 / 0.8)
    assert fused["d"] == pytest.approx(0.0 + 0.56 / 0.8)


def test_a_method_without_a_positive_score_adds_nothing() -> None:
    fused = score_fusion([{}, DENSE], [1.0, 1.0])
    assert [d for d, _ in fused] == ["c", "d", "a"]
    assert [s for _, s in fused] == pytest.approx([1.0, 0.7, 0.5])
    assert dict(score_fusion([{"x": 0.0}, DENSE], [1.0, 1.0]))["x"] == pytest.approx(0.5)


def test_ties_are_broken_by_id() -> None:
    assert [d for d, _ in score_fusion([{"y": 1.0, "x": 1.0}], [1.0])] == ["x", "y"]
    assert score_fusion([], []) == []


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="1 weights for 2 score lists"):
        score_fusion([BM25, DENSE], [1.0])
    with pytest.raises(ValueError, match="1 lookups for 2 score lists"):
        score_fusion([BM25, DENSE], [1.0, 1.0], [None])


def test_fuse_follows_the_settings() -> None:
    assert FusionSettings().method == Fusion.SCORE
    assert fuse([BM25, DENSE], FusionSettings()) == score_fusion([BM25, DENSE], [1.0, 1.0])
    plain = FusionSettings(method=Fusion.RRF, rrf_k=10, bm25_weight=2.0)
    assert fuse([BM25, DENSE], plain) == rrf([list(BM25), list(DENSE)], k=10,
                                            weights=[2.0, 1.0])
    # A third list (the embedded index's named sections) with its own weight.
    named = {"d": 1.0}
    fused = dict(fuse([BM25, DENSE, named], FusionSettings(), [1.0],
                      [None, None, lambda d: 0.0]))
    assert fused["d"] == pytest.approx(5 / 20 + 0.56 / 0.8 + 1.0)
    assert fused["a"] == pytest.approx(1.5)
