import numpy as np

from bench.intents_finetune import open_set_scores, pick_threshold

CLASSES = ["a", "b", "oos"]
# rows: in-scope a (clear), in-scope b (weak), oos (weak), oos (strong on a)
COS = np.array([[0.9, 0.1, 0.0], [0.2, 0.4, 0.0], [0.3, 0.2, 0.5], [0.6, 0.1, 0.2]])
GOLD = np.array(["a", "b", "oos", "oos"])


def test_low_best_in_scope_cosine_is_out_of_scope_and_the_oos_class_is_ignored() -> None:
    s = open_set_scores(COS, CLASSES, GOLD, 0.35, "oos")
    assert s == {"in_scope_accuracy": 1.0, "in_scope_argmax": 1.0, "oos_recall": 0.5}
    assert open_set_scores(COS, CLASSES, GOLD, 0.5, "oos")["in_scope_accuracy"] == 0.5


def test_threshold_keeps_the_required_recall_at_the_best_in_scope_accuracy() -> None:
    th = pick_threshold(COS, CLASSES, GOLD, "oos", 0.5)
    assert 0.3 <= th <= 0.4
    assert pick_threshold(COS, CLASSES, GOLD, "oos", 1.0) > 0.6  # needs row 4 rejected too
