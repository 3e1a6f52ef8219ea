"""The classifier benchmark times Layer 2 on text the head never saw."""

from __future__ import annotations

import json

from bench.classifier_embedding import TRAIN, texts_for_bench


def test_heldout_bench_texts_are_distinct_and_not_training_lines() -> None:
    texts = texts_for_bench(1500)
    assert len(texts) == len(set(texts)) == 1500
    trained = {json.loads(line)["text"] for line in TRAIN.read_text().splitlines() if line}
    assert not trained & set(texts)
    assert set(texts_for_bench(50, "project")) <= trained  # the in-sample option
