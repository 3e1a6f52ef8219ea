"""`eval intents`' defaults: the out-of-scope threshold chosen on held-out train lines
only, and several encoders read side by side as one unit vector."""

from __future__ import annotations

import numpy as np
import pytest

from services.classifier.offline.intents_eval import mix_members, oos_threshold
from shared.encoders.concat import ConcatEncoder

LABELS = ["a", "b", "oos"]


def _probs(rows: list[tuple[int, float]]) -> np.ndarray:
    """One row per (argmax index, its probability), the rest spread evenly."""
    out = np.zeros((len(rows), len(LABELS)))
    for i, (k, p) in enumerate(rows):
        out[i] = (1 - p) / (len(LABELS) - 1)
        out[i, k] = p
    return out


def test_threshold_rejects_unsure_out_of_scope_lines_and_keeps_sure_in_scope_ones() -> None:
    # In scope: right and sure (0.9) or wrong and unsure (0.35); out of scope: mistaken
    # for "a" at 0.4. Any threshold in (0.4, 0.9] rejects every oos line and no right one.
    probs = _probs([(0, 0.9)] * 8 + [(1, 0.35)] * 2 + [(0, 0.4)] * 4)
    y = np.array([0] * 8 + [0] * 2 + [2] * 4)
    th = oos_threshold(probs, y, LABELS, "oos", prior=0.1)
    assert th is not None
    assert 0.4 < th <= 0.9


def test_a_small_prior_keeps_in_scope_lines_that_a_large_one_would_reject() -> None:
    # Right in-scope lines at 0.45, oos lines mistaken for "a" at 0.5: rejecting the oos
    # lines rejects the in-scope ones too; the weight oos lines get decides.
    probs = _probs([(0, 0.45)] * 10 + [(0, 0.5)] * 10)
    y = np.array([0] * 10 + [2] * 10)
    low = oos_threshold(probs, y, LABELS, "oos", prior=0.1)
    high = oos_threshold(probs, y, LABELS, "oos", prior=0.9)
    assert low is not None
    assert high is not None
    assert low <= 0.45 < 0.5 < high


def test_no_threshold_is_chosen_without_out_of_scope_lines() -> None:
    probs = _probs([(0, 0.9), (1, 0.8)])
    assert oos_threshold(probs, np.array([0, 1]), LABELS, "oos") is None
    assert oos_threshold(probs, np.array([0, 1]), ["a", "b"], "oos") is None


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
