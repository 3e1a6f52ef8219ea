"""`eval intents`' defaults: out of scope at the traffic's prior, several encoders read
side by side as one unit vector, and the mixture's weights."""

from __future__ import annotations

import numpy as np
import pytest

from offline.classifier.mixture import mix_members, prior_shift
from shared.encoders.concat import ConcatEncoder

LABELS = ["a", "b", "oos"]


def _probs(rows: list[tuple[int, float]]) -> np.ndarray:
    """One row per (argmax index, its probability), the rest spread evenly."""
    out = np.zeros((len(rows), len(LABELS)))
    for i, (k, p) in enumerate(rows):
        out[i] = (1 - p) / (len(LABELS) - 1)
        out[i, k] = p
    return out


def test_the_prior_shift_moves_unsure_lines_out_of_scope_and_keeps_sure_ones() -> None:
    # oos lines were 1% of the train split; at 10% of the traffic an "a" at 0.5 against
    # "oos" at 0.3 becomes out of scope, an "a" at 0.9 against 0.05 stays "a".
    probs = np.array([[0.5, 0.2, 0.3], [0.9, 0.05, 0.05]])
    shifted = prior_shift(probs, LABELS, "oos", train_share=0.01, prior=0.1)
    assert list(shifted.argmax(axis=1)) == [2, 0]
    assert np.allclose(shifted.sum(axis=1), 1.0)
    # Bayes' rule: the in-scope classes keep their ratio, oos gains the odds' ratio.
    assert shifted[0, 0] / shifted[0, 1] == pytest.approx(0.5 / 0.2)
    odds = (0.1 / 0.9) / (0.01 / 0.99)
    assert (shifted[0, 2] / shifted[0, 0]) == pytest.approx(odds * 0.3 / 0.5)


def test_no_shift_without_out_of_scope_lines_or_at_their_own_share() -> None:
    probs = _probs([(0, 0.6), (1, 0.5)])
    assert prior_shift(probs, ["a", "b", "c"], "oos", train_share=0.01) is probs
    assert prior_shift(probs, LABELS, "oos", train_share=0.0) is probs
    assert np.allclose(prior_shift(probs, LABELS, "oos", train_share=0.1, prior=0.1), probs)


class _Fixed:
    def __init__(self, vectors: np.ndarray) -> None:
        self.vectors = vectors.astype(np.float32)

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        return self.vectors[: len(texts)]


def test_concatenated_encoders_give_one_unit_vector_per_text() -> None:
    a = _Fixed(np.array([[1.0, 0.0], [0.0, 1.0]]))
    b = _Fixed(np.array([[0.6, 0.8, 0.0], [0.0, 0.0, 1.0]]))
    enc = ConcatEncoder([a, b], ["m1", "m2"])
    vecs = enc.encode(["x", "y"])
    assert enc.dim == 5
    assert enc.model_name == "m1+m2"
    assert vecs.shape == (2, 5)
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0)
    # Cosines average the members': identical texts 1, these two 0.
    assert vecs[0] @ vecs[1] == pytest.approx(0.0)


def test_the_mixture_takes_the_weights_that_fix_the_most_held_out_lines() -> None:
    # Each member is sure and right on its own half of the lines and unsure and wrong
    # (0.4 for the right class, 0.55 for a wrong one) on the other half: only a mixture
    # of both gets every line right.
    y = np.array([0, 0, 1, 1])
    sure = {0: [0.9, 0.05, 0.05], 1: [0.05, 0.9, 0.05]}
    unsure_wrong = {0: [0.4, 0.55, 0.05], 1: [0.55, 0.4, 0.05]}
    a = np.array([sure[0], unsure_wrong[0], sure[1], unsure_wrong[1]])
    b = np.array([unsure_wrong[0], sure[0], unsure_wrong[1], sure[1]])
    weights, held, test = mix_members([a, b], [a[:1], b[:1]], y)
    assert sum(weights) == pytest.approx(1.0)
    assert 0.0 < weights[0] < 1.0
    assert (held.argmax(axis=1) == y).all()
    assert np.allclose(held.sum(axis=1), 1.0)
    assert test.shape == (1, 3)


def test_a_member_that_adds_nothing_gets_no_weight() -> None:
    y = np.array([0, 1, 2, 0])
    head = _probs([(0, 0.9), (1, 0.8), (2, 0.7), (0, 0.6)])
    useless = np.full((4, 3), 1 / 3)
    weights, held, _ = mix_members([head, useless], [head, useless], y)
    assert weights == (1.0, 0.0)
    assert (held.argmax(axis=1) == y).all()
