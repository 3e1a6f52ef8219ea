"""Layer 2 of the classifier cascade, as the worker runs it: an embedding head with a
calibrated confidence (ADR-0008 "Future Path", ADR-018 clarity gate).

* `features`    the hashed character n-gram block a head reads beside the sentence vector
* `head`        `EmbeddingHead`: coefficients + temperature, saved as .npy + JSON
* `predict`     `Prediction`, and the early exit (a shallow encoder's head answers first)
* `registry`    `HeadRegistry`: read the CURRENT head, hot reload; seed from the shipped head
* `classifier`  `Layer2Classifier`: encoder(s) + current head -> predictions
* `batcher`     `MicroBatcher`: concurrent submissions encoded together off the event loop

Training, promotion and evaluation live in `offline.classifier` (tools/offline/, development
only: the wheel does not ship it).
"""
