"""The lexical block of a head's input: hashed character n-grams of the text.

The default encoder is English-only; the n-grams carry Spanish wording and AVAP command
names. Stateless (nothing to fit): a head stores only the settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class LexicalFeatures:
    """l2-normalised hashed char n-gram counts, scaled by `weight`."""

    def __init__(self, settings: dict[str, Any]) -> None:
        from sklearn.feature_extraction.text import HashingVectorizer

        self.settings = dict(settings)
        self.weight = float(settings.get("weight", 1.0))
        self.n_features = int(settings["n_features"])
        self._hasher = HashingVectorizer(
            analyzer=settings.get("analyzer", "char_wb"),
            ngram_range=tuple(settings.get("ngram_range", (2, 5))),
            n_features=self.n_features,
            alternate_sign=False,
            norm="l2",
            lowercase=True,
        )

    def transform(self, texts: Sequence[str]) -> Any:
        return self._hasher.transform(list(texts)) * self.weight
