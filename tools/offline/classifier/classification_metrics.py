"""Scores shared by training, promotion and the evaluations."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def macro_f1(y_true: Sequence[str] | np.ndarray, y_pred: Sequence[str] | np.ndarray) -> float:
    from sklearn.metrics import f1_score

    return float(f1_score(list(y_true), list(y_pred), average="macro", zero_division=0))
