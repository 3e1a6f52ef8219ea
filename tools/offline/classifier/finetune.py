"""Opt-in CPU fine-tuning of the sentence encoder for the Layer 2 head.

A plain classification fine-tune: encoder -> mean pooling -> L2 normalisation ->
cosine classifier (normalised class weights, fixed scale), cross-entropy, AdamW with
linear warm-up/decay, dynamic padding, short max length (queries are short).
The class weights start at the class centroids of the frozen embeddings, so the
first steps already point the right way and one epoch is usually enough.

Because the training objective is a cosine classifier over the same normalised
mean-pooled vectors that `FastEncoder` produces, the logistic-regression head that
`train_head` fits afterwards on the fine-tuned vectors is well matched.

The output directory is a complete sentence-transformers model dir (weights,
tokenizer, pooling/normalize modules), loadable by `FastEncoder(dir)` and
`SentenceTransformerEncoder(str(dir))`.

Cost on this 2-core CPU: ~0.3-0.6 s per step of 32 -> CLINC150 (15k lines) about
4-6 minutes per epoch, HWU64 (9k) about 2-4 minutes.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shared.encoders.embeddings import DEFAULT_MODEL, resolve_model_path

log = logging.getLogger("intentroute.classifier.finetune")

_COPY_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
    "sentence_bert_config.json",
    "modules.json",
    "config_sentence_transformers.json",
)
_COPY_DIRS = ("1_Pooling", "2_Normalize")


def finetune_encoder(
    texts: Sequence[str],
    labels: Sequence[str],
    out_dir: Path,
    *,
    base_model: str = DEFAULT_MODEL,
    epochs: float = 1.0,
    batch_size: int = 32,
    lr: float = 8e-5,
    head_lr: float = 2e-3,
    scale: float = 30.0,
    max_length: int = 64,
    warmup: float = 0.06,
    weight_decay: float = 0.01,
    label_smoothing: float = 0.0,
    threads: int | None = None,
    seed: int = 0,
    max_seconds: float | None = None,
    progress: Callable[[str], None] | None = None,
    progress_bar: bool = False,
) -> dict[str, Any]:
    """Fine-tune `base_model` on (texts, labels); write the encoder to `out_dir`.

    `epochs` may be fractional. `max_seconds` bounds the wall time (training stops
    early, the schedule is not stretched). `progress_bar`: a bar of the steps on stderr
    (tqdm). Returns a small report dict.
    """
    # Read by torch / Hugging Face when they load: idle OpenMP threads must not spin on
    # the shared cores, and the packaged model must never trigger a download.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoModel, AutoTokenizer

    say = progress or (lambda m: log.info(m))
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)

    src = Path(resolve_model_path(base_model))
    tok = AutoTokenizer.from_pretrained(str(src))
    model = AutoModel.from_pretrained(str(src))
    classes = sorted(set(labels))
    y = np.searchsorted(classes, list(labels))
    texts = list(texts)
    embed = _embedder(tok, model, max_length)

    t0 = time.perf_counter()
    weight = _centroid_weights(embed, model, texts, y, len(classes), rng)
    say(f"centroid init {time.perf_counter() - t0:.1f}s")

    total = max(1, round(math.ceil(len(texts) / batch_size) * epochs))
    opt, sched = _optimizer(model, weight, total, lr=lr, head_lr=head_lr,
                            weight_decay=weight_decay, warmup=warmup)
    model.train()
    started = time.perf_counter()
    run = _Run(total)
    from tqdm.auto import tqdm

    with tqdm(total=total, desc="fine-tune", unit="step", disable=not progress_bar,
              file=sys.stderr) as bar:
        while run.step < total:
            _epoch(run, embed, weight, model, opt, sched, texts, y,
                   rng.permutation(len(texts)), batch_size=batch_size, scale=scale,
                   label_smoothing=label_smoothing, started=started,
                   max_seconds=max_seconds, say=say, tick=bar.update)
            if run.stopped_early:
                say(f"time budget reached at step {run.step}/{total}")
                break

    model.eval()
    _save(model, weight, src, Path(out_dir), classes)
    report = {
        "base_model": base_model,
        "epochs": epochs,
        "steps": run.step,
        "examples_seen": run.seen,
        "seconds": round(time.perf_counter() - started, 1),
        "final_loss": run.loss_ema,
        "stopped_early": run.stopped_early,
    }
    say(f"fine-tune done: {report}")
    return report


def _embedder(tok: Any, model: Any, max_length: int) -> Callable[[list[str]], Any]:
    """Texts -> mean-pooled, L2-normalised vectors (dynamic padding, truncated)."""
    import torch.nn.functional as nnf

    def embed(batch: list[str]) -> Any:
        enc = tok(batch, padding=True, truncation=True, max_length=max_length,
                  return_tensors="pt")
        h = model(**enc).last_hidden_state
        m = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
        v = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return nnf.normalize(v, dim=-1)

    return embed


def _centroid_weights(embed: Callable[[list[str]], Any], model: Any, texts: list[str],
                      y: np.ndarray, n_classes: int, rng: np.random.Generator) -> Any:
    """The cosine classifier's weights, started at the frozen encoder's class centroids
    (of <= 16 lines per class: cheap)."""
    import torch
    import torch.nn.functional as nnf

    model.eval()
    pick = np.concatenate(
        [rng.permutation(np.flatnonzero(y == k))[:16] for k in range(n_classes)]
    )
    centroids = torch.zeros(n_classes, model.config.hidden_size)
    with torch.inference_mode():
        for i in range(0, len(pick), 128):
            idx = pick[i : i + 128]
            centroids.index_add_(0, torch.from_numpy(y[idx]), embed([texts[j] for j in idx]))
    return torch.nn.Parameter(nnf.normalize(centroids, dim=-1).clone())


def _optimizer(model: Any, weight: Any, total: int, *, lr: float, head_lr: float,
               weight_decay: float, warmup: float) -> tuple[Any, Any]:
    """AdamW (encoder at `lr` with weight decay, classifier at `head_lr` without) and its
    schedule: linear warm-up over `warmup` of the `total` steps, then linear decay."""
    import torch

    opt = torch.optim.AdamW(
        [
            {"params": [p for p in model.parameters() if p.requires_grad], "lr": lr,
             "weight_decay": weight_decay},
            {"params": [weight], "lr": head_lr, "weight_decay": 0.0},
        ]
    )
    warm = max(1, int(total * warmup))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return max(0.0, (total - step) / max(1, total - warm))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


@dataclass
class _Run:
    """Where training stands: steps taken (of `total`), lines seen, the loss's moving
    average, whether the time budget ended it."""

    total: int
    step: int = 0
    seen: int = 0
    loss_ema: float | None = None
    stopped_early: bool = False


def _epoch(run: _Run, embed: Callable[[list[str]], Any], weight: Any, model: Any, opt: Any,
           sched: Any, texts: list[str], y: np.ndarray, perm: np.ndarray, *,
           batch_size: int, scale: float, label_smoothing: float, started: float,
           max_seconds: float | None, say: Callable[[str], None],
           tick: Callable[[], object]) -> None:
    """One pass over the lines in `perm`'s order, a step per batch, until the last step
    or the time budget."""
    for i in range(0, len(perm), batch_size):
        if run.step >= run.total:
            break
        idx = perm[i : i + batch_size]
        lv = _step(embed, weight, model, opt, sched, [texts[j] for j in idx], y[idx],
                   scale=scale, label_smoothing=label_smoothing)
        run.step += 1
        run.seen += len(idx)
        tick()
        run.loss_ema = lv if run.loss_ema is None else 0.95 * run.loss_ema + 0.05 * lv
        if run.step % 50 == 0 or run.step == run.total:
            el = time.perf_counter() - started
            say(f"step {run.step}/{run.total} loss {run.loss_ema:.3f} {el:.0f}s "
                f"({el / run.step:.2f}s/step)")
        if max_seconds is not None and time.perf_counter() - started > max_seconds:
            run.stopped_early = True
            break


def _step(embed: Callable[[list[str]], Any], weight: Any, model: Any, opt: Any, sched: Any,
          batch: list[str], y: np.ndarray, *, scale: float, label_smoothing: float) -> float:
    """One optimisation step on a batch (cosine logits, cross-entropy, clipped
    gradients); returns its loss."""
    import torch
    import torch.nn.functional as nnf

    v = embed(batch)
    logits = scale * v @ nnf.normalize(weight, dim=-1).T
    loss = nnf.cross_entropy(logits, torch.from_numpy(y), label_smoothing=label_smoothing)
    opt.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]  # torch's autograd entry is untyped
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    return float(loss.detach())


def _save(model: Any, weight: Any, src: Path, out: Path, classes: list[str]) -> None:
    """A complete sentence-transformers dir: the weights, the base model's tokenizer and
    pooling/normalize modules, and the cosine classifier the encoder was trained against
    (labels + unit weights: a head may use it beside its own coefficients)."""
    import torch.nn.functional as nnf

    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    for name in _COPY_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, out / name)
    for name in _COPY_DIRS:
        if (src / name).exists():
            shutil.copytree(src / name, out / name, dirs_exist_ok=True)
    np.save(out / "cosine_head.npy", nnf.normalize(weight.detach(), dim=-1).numpy())
    (out / "cosine_head_labels.txt").write_text("\n".join(classes) + "\n", encoding="utf-8")


def load_cosine_head(encoder_dir: Path) -> tuple[np.ndarray, list[str]]:
    """The cosine classifier `_save` wrote beside the encoder: unit class weights (one row
    per label) and the labels in their order."""
    labels = (encoder_dir / "cosine_head_labels.txt").read_text(encoding="utf-8")
    return np.load(encoder_dir / "cosine_head.npy"), labels.split("\n")[:-1]
