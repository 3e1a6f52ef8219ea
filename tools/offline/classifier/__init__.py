"""Offline tools for Layer 2, apart from the worker that serves it (`services.classifier`
never imports them: import-linter).

* `labelled`      labelled lines: JSONL/CSV loaders, dedupe, stratified split
* `calibration`   temperature fitting and expected calibration error
* `classification_metrics`  macro-F1
* `train`         `train_head`: logistic head + temperature (+ early exit, + fine-tune)
* `finetune`      opt-in CPU fine-tune of the sentence encoder
* `promote`       `HeadWriter`: add versions, move CURRENT, shadow-evaluated promotion;
                  `train_and_promote` (what `intentroute train-classifier` runs)
* `intents_eval`  `intentroute eval intents`: train on one intent file, score on another
* `routing_eval`  `intentroute eval routing`: labelled lines through the real cascade
"""
