"""`eval intents`' defaults: the out-of-scope threshold chosen on held-out train lines
only, and several encoders read side by side as one unit vector."""

from __future__ import annotations

import numpy as np
import pytest

from services.classifier.offline.intents_eval import oos_threshold
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
