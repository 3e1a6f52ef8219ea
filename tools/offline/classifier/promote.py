"""The write side of the head registry: store a version, move CURRENT, and promote a
candidate only when a shadow evaluation says it is not worse than the current head.

`train_and_promote` is the whole flywheel step behind `intentroute train-classifier`:
load labelled lines, split, train a candidate, shadow-evaluate, promote. Running workers
pick a promoted head up without a restart (`HeadRegistry.maybe_reload`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from offline.classifier.classification_metrics import macro_f1
from offline.classifier.labelled import dedupe, load_labelled, stratified_split
from offline.classifier.train import train_head
from services.classifier.layer2.head import EmbeddingHead
from services.classifier.layer2.predict import head_predictions
from services.classifier.layer2.registry import VERSION_PREFIX, HeadRegistry, write_pointer
from shared.encoders.embeddings import Encoder

log = logging.getLogger("intentroute.classifier.promote")


class PromotionResult(msgspec.Struct, frozen=True):
    promoted: bool
    reason: str
    candidate: dict[str, float]
    current: dict[str, float] | None
    version: str | None  # the candidate's version when promoted
    previous_version: str | None
    n_eval: int


def evaluate_head(
    head: EmbeddingHead,
    encoder: Encoder,
    texts: Sequence[str],
    labels: Sequence[str],
    *,
    early_encoder: Encoder | None = None,
) -> dict[str, float]:
    """Accuracy and macro-F1 of `head` as the worker would answer (early exit included
    when `early_encoder` is given)."""
    preds = head_predictions(head, encoder, texts, early_encoder=early_encoder)
    guess = [p.label for p in preds]
    acc = float(np.mean([g == t for g, t in zip(guess, labels, strict=True)]))
    return {"accuracy": acc, "macro_f1": macro_f1(labels, guess), "n": len(labels)}


class HeadWriter(HeadRegistry):
    """A registry that also adds versions and promotes them.

    Only promoted candidates get a version directory; refused candidates are logged
    (metrics + shadow scores) in `root/rejected.jsonl`. Heads are evaluated with
    `encoder` (default: each head's own), encoders built here as the worker builds them
    (`default_precision` for a head that names none, ONNX graphs in `onnx_cache_dir`).
    """

    def __init__(
        self,
        root: Path,
        encoder: Encoder | None = None,
        *,
        default_precision: str = "fp32",
        onnx_cache_dir: Path | None = None,
    ) -> None:
        super().__init__(root)
        self._encoder = encoder
        self._default_precision = default_precision
        self._onnx_cache_dir = onnx_cache_dir

    def _make(self, head: EmbeddingHead, threads: int = 1) -> Encoder:
        return head.make_encoder(threads=threads, default_precision=self._default_precision,
                                 onnx_cache_dir=self._onnx_cache_dir)

    def _evaluate(
        self, head: EmbeddingHead, texts: Sequence[str], labels: Sequence[str]
    ) -> dict[str, float]:
        if head.has_own_encoder:
            encoder = self._make(head, threads=max(1, os.cpu_count() or 1))
        else:
            encoder = self._encoder if self._encoder is not None else self._make(head)
        early = self._make(head.early) if head.early is not None else None
        return evaluate_head(head, encoder, texts, labels, early_encoder=early)

    def add(self, head: EmbeddingHead) -> str:
        """Store `head` as the next version (not promoted)."""
        self.root.mkdir(parents=True, exist_ok=True)
        staging = self.root / f".staging-{os.getpid()}-{threading.get_ident()}-{time.time_ns()}"
        head.save(staging)
        while True:
            existing = self.versions()
            n = int(existing[-1][1:]) + 1 if existing else 1
            version = f"{VERSION_PREFIX}{n:04d}"
            try:
                os.rename(staging, self.root / version)  # atomic; fails if taken
                return version
            except OSError:
                if not (self.root / version).exists():
                    raise

    def set_current(self, version: str) -> None:
        if not (self.root / version / "head.json").exists():
            raise FileNotFoundError(f"no head {version} under {self.root}")
        write_pointer(self.root, version)

    def propose(
        self,
        head: EmbeddingHead,
        eval_texts: Sequence[str],
        eval_labels: Sequence[str],
        *,
        tolerance: float = 0.0,
    ) -> PromotionResult:
        """Shadow-evaluate `head` against the current head on the same held-out lines.

        Promote when macro-F1 >= current - tolerance and accuracy >= current.
        """
        eval_texts, eval_labels = list(eval_texts), [str(x) for x in eval_labels]
        if not eval_texts:
            raise ValueError("shadow evaluation needs held-out lines")
        cand = self._evaluate(head, eval_texts, eval_labels)
        previous = self.current_version
        cur_head = self.current() if previous else None
        cur = self._evaluate(cur_head, eval_texts, eval_labels) if cur_head is not None else None
        if cur is None:
            ok, reason = True, "no current head"
        elif (
            cand["macro_f1"] >= cur["macro_f1"] - tolerance
            and cand["accuracy"] >= cur["accuracy"]
        ):
            ok, reason = True, "candidate not worse than current"
        else:
            ok = False
            reason = (
                f"candidate worse: macro_f1 {cand['macro_f1']:.4f} vs {cur['macro_f1']:.4f}, "
                f"accuracy {cand['accuracy']:.4f} vs {cur['accuracy']:.4f}"
            )
        version: str | None = None
        head.metrics["shadow_eval"] = {"candidate": cand, "current": cur, "against": previous}
        if ok:
            version = self.add(head)
            self.set_current(version)
            log.info("[classifier] promoted head %s (%s)", version, reason)
        else:
            self.root.mkdir(parents=True, exist_ok=True)
            with open(self.root / "rejected.jsonl", "a") as f:
                f.write(json.dumps({"at": time.time(), "reason": reason,
                                    "metrics": head.metrics}, default=str) + "\n")
            log.info("[classifier] refused candidate head: %s", reason)
        return PromotionResult(
            promoted=ok,
            reason=reason,
            candidate=cand,
            current=cur,
            version=version,
            previous_version=previous,
            n_eval=len(eval_texts),
        )


def train_and_promote(
    data_files: Path | str | Iterable[Path | str],
    registry: HeadWriter,
    encoder: Encoder | None,
    *,
    holdout: float = 0.2,
    seed: int = 0,
    finetune_epochs: float = 0.0,
    **train_kw: Any,
) -> PromotionResult:
    """Load, split (stratified), train a candidate on the train part and shadow-evaluate
    it against the registry's current head on the held-out part; promote if not worse.
    """
    files = [data_files] if isinstance(data_files, str | Path) else list(data_files)
    rows = dedupe(load_labelled(files))
    if not rows:
        raise ValueError("no labelled lines")
    train_rows, eval_rows = stratified_split(rows, holdout, seed)
    if not eval_rows:
        raise ValueError("holdout too small: no held-out lines for the shadow evaluation")
    head = train_head(
        [t for t, _ in train_rows],
        [lab for _, lab in train_rows],
        encoder,
        seed=seed,
        finetune_epochs=finetune_epochs,
        **train_kw,
    )
    head.meta["data_files"] = [str(p) for p in files]
    head.meta["holdout"] = holdout
    head.meta["n_eval"] = len(eval_rows)
    result = registry.propose(head, [t for t, _ in eval_rows], [lab for _, lab in eval_rows])
    log.info("[classifier] train_and_promote: %s", result.reason)
    return result
