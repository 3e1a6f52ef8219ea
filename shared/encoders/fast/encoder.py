"""Fast single-message sentence encoder (same vectors as `SentenceTransformerEncoder`).

Per-query latency matters for the classifier's Layer 2 and the retriever's query
embedding. sentence-transformers costs ~8-19 ms per message on this CPU; most of it
is framework overhead around a tiny (6 x 384) transformer. `FastEncoder`:

* tokenises with the Rust `tokenizers` fast path (no padding for a single message,
  dynamic padding to the longest text for a batch, texts sorted by length),
* runs the transformer with ONNX Runtime (graph optimisations on, 1 thread by default)
  when `onnxruntime` (+ `onnx` for the export) is installed. The graph is built once
  per model, layer count and precision (`shared.encoders.fast.build`, imported only
  then) and cached under `onnx_cache_dir` (see `GraphFiles` for the names and the
  rule for model directories under the temp dir); without ONNX Runtime it calls the
  Hugging Face model directly under `torch.inference_mode`,
* mean-pools over the attention mask and L2-normalises, exactly like the reference
  model's Pooling + Normalize modules (cosine with the reference >= 0.9999),
* keeps an LRU cache of recent texts (repeated queries cost a dict lookup).

Measured on the 2-core AVX-512/VNNI machine (1 thread, p50 per message, project-length
queries): fp32 ~6.2-6.9 ms, int8 ~2.8-3.1 ms. Plain dynamic int8 MatMuls put cosine
with the reference at 0.992 mean / 0.955 worst line (per-tensor activation scales vs a
few outlier channels); the int8 graph is therefore SmoothQuant-smoothed with layer 0's
FFN output MatMul left in fp32: 0.998 mean / 0.991 worst on the held-out routing-eval
queries, 0.9955 worst on SciFact abstracts. Callers choose the precision (settings
`encoder_precision`, `ingest_precision`; fp32 by default); a classifier head is served
at the precision it was trained with (the shipped head: int8).
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from shared.encoders.embeddings import DEFAULT_MODEL, Vectors, resolve_model_path
from shared.encoders.fast.graphs import GraphFiles
from shared.encoders.fast.model_dir import (
    check_mean_pooling,
    load_auto_model,
    load_embedding_module,
    max_seq_length,
)

log = logging.getLogger("intentroute.fast_encoder")

PRECISIONS = ("fp32", "int8", "int8-block")
# onnxruntime's own (C++) log: errors only. Its warnings on these graphs ("Removing
# initializer ...") ask nothing of the person running the stack.
ORT_ERRORS_ONLY = 3


def onnxruntime_available() -> bool:
    return importlib.util.find_spec("onnxruntime") is not None


class FastEncoder:
    """`Encoder` protocol: L2-normalised mean-pooled float32 rows.

    backend: "auto" (ONNX Runtime if installed, else torch), "onnx" or "torch".
    model: the packaged default name or a directory (e.g. a fine-tuned encoder saved
    by `services.classifier.finetune`).
    layers: keep only the first `layers` transformer layers (None: all); a head trained
    on such a shallow encoder is the early exit of Layer 2 (`EmbeddingHead.early`).
    `layers=0` is the embedding module alone (word + position + token-type tables,
    LayerNorm): a table lookup in numpy, no transformer, ~0.05 ms per message;
    precision does not apply to it.
    precision: "fp32" (default; cosine with the reference >= 0.9999), "int8-block"
    (ONNX only: the fused graph's MatMuls with blockwise 8-bit weights, see
    `blockwise_int8_onnx`; cosine ~0.9998 mean / ~0.999 worst line) or "int8"
    (ONNX only: smoothed dynamic int8 MatMuls, ~2x faster with VNNI, cosine with the
    reference ~0.998 mean / ~0.99 worst line; train a head with the same setting).
    onnx_cache_dir: where built graphs are kept (None: ~/.cache/intentroute/onnx).
    """

    _run: Callable[[np.ndarray, np.ndarray], np.ndarray]  # ids, mask -> hidden states

    def __init__(
        self,
        model: str | Path = DEFAULT_MODEL,
        *,
        backend: str = "auto",
        threads: int = 1,
        cache_size: int = 4096,
        onnx_cache_dir: Path | None = None,
        max_length: int | None = None,
        precision: str = "fp32",
        max_chunk: int = 8,
        layers: int | None = None,
    ) -> None:
        import tokenizers

        self.model_name = str(model)
        self.model_dir = Path(resolve_model_path(str(model)))
        check_mean_pooling(self.model_dir)
        self.max_length = max_length or max_seq_length(self.model_dir)
        tok = tokenizers.Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
        tok.no_padding()
        tok.enable_truncation(self.max_length)
        self._tok = tok
        self._threads = threads
        # Texts are sorted by length and run in chunks of <= max_chunk: on one CPU
        # thread bigger padded batches cost more per text (measured: chunks of 4-8 of
        # similar length ~150 texts/s, unsorted batches of 32 ~55 texts/s).
        self.max_chunk = max(1, max_chunk)
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}")
        self.precision = precision
        if layers is not None and layers < 0:
            raise ValueError("layers must be >= 0")
        self.layers = layers
        self._lock = threading.Lock()
        # Where this encoder's graphs live: encoders derived from it reuse it.
        self.onnx_cache_dir = onnx_cache_dir
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_size = cache_size
        self.cache_hits = 0

        if layers == 0:
            backend = "embeddings"
            self._init_embeddings()
        elif backend == "auto":
            backend = "onnx" if onnxruntime_available() else "torch"
        if backend == "onnx":
            try:
                self._init_onnx(onnx_cache_dir)
            except Exception as exc:  # export/runtime problem: keep working on torch
                log.warning("ONNX backend unavailable (%s); using torch", exc)
                backend = "torch"
        if backend == "torch":
            if precision != "fp32":
                raise ValueError("int8 precision needs the ONNX backend (onnxruntime)")
            self._init_torch()
        elif backend not in ("onnx", "embeddings"):
            raise ValueError(f"unknown backend {backend!r}")
        self.backend = backend
        self._dim = int(self._forward([[101, 102]])[0].shape[-1])

    # -- backends -------------------------------------------------------------------
    def _init_onnx(self, cache_dir: Path | None) -> None:
        import onnxruntime as ort

        ort.set_default_logger_severity(ORT_ERRORS_ONLY)

        files = GraphFiles.for_model(self.model_dir, self.layers, cache_dir)
        path = files.ready(self.precision)
        if path is None:
            from shared.encoders.fast.build import build_graph

            path = build_graph(self.model_dir, files, self.precision, self.layers, self._tok)
        so = ort.SessionOptions()
        so.log_severity_level = ORT_ERRORS_ONLY
        so.intra_op_num_threads = self._threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Idle ORT worker threads must not spin on 2 shared cores.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(
            str(path), so, providers=["CPUExecutionProvider"]
        )
        self.onnx_path = path

        def run(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            out: np.ndarray = self._session.run(
                None, {"input_ids": ids, "attention_mask": mask})[0]
            return out

        self._run = run

    def _init_embeddings(self) -> None:
        emb = load_embedding_module(self.model_dir)
        word, position = emb["word"], emb["position"]
        gamma, beta, eps, offset = emb["ln_weight"], emb["ln_bias"], emb["eps"], emb[
            "position_offset"]

        def run(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            x = word[ids] + position[offset : offset + ids.shape[1]]
            mean = x.mean(axis=-1, keepdims=True)
            var = x.var(axis=-1, keepdims=True)
            out: np.ndarray = (x - mean) / np.sqrt(var + eps) * gamma + beta
            return out

        self._run = run

    def _init_torch(self) -> None:
        import torch

        model = load_auto_model(self.model_dir, self.layers)
        self._torch_model = model

        def run(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                out = model(
                    input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)
                ).last_hidden_state
            hidden: np.ndarray = out.numpy()
            return hidden

        self._run = run

    # -- Encoder protocol -----------------------------------------------------------
    @property
    def dim(self) -> int:
        return self._dim

    def _forward(self, batch_ids: list[list[int]]) -> Vectors:
        longest = max(len(x) for x in batch_ids)
        ids = np.zeros((len(batch_ids), longest), dtype=np.int64)
        mask = np.zeros_like(ids)
        for i, row in enumerate(batch_ids):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        hidden = self._run(ids, mask).astype(np.float32, copy=False)
        m = mask[:, :, None].astype(np.float32)
        pooled = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        vectors: Vectors = (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
        return vectors

    def encode(self, texts: list[str], batch_size: int = 32) -> Vectors:
        out = np.zeros((len(texts), self._dim), np.float32)
        todo: list[int] = []
        if self._cache_size:
            with self._lock:
                for i, t in enumerate(texts):
                    hit = self._cache.get(t)
                    if hit is None:
                        todo.append(i)
                    else:
                        self._cache.move_to_end(t)
                        out[i] = hit
                        self.cache_hits += 1
        else:
            todo = list(range(len(texts)))
        if not todo:
            return out
        encs = self._tok.encode_batch([texts[i] for i in todo], add_special_tokens=True)
        order = sorted(range(len(todo)), key=lambda k: len(encs[k].ids))
        step = max(1, min(batch_size, self.max_chunk))
        for start in range(0, len(order), step):
            chunk = order[start : start + step]
            vecs = self._forward([encs[k].ids for k in chunk])
            for k, v in zip(chunk, vecs, strict=True):
                out[todo[k]] = v
        if self._cache_size:
            with self._lock:
                for i in todo:
                    self._cache[texts[i]] = out[i].copy()
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return out

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()


_shared: dict[tuple[Any, ...], FastEncoder] = {}
_shared_lock = threading.Lock()


def shared_fast_encoder(
    model: str | Path = DEFAULT_MODEL,
    *,
    backend: str = "auto",
    threads: int = 1,
    precision: str = "fp32",
    layers: int | None = None,
    onnx_cache_dir: Path | None = None,
) -> FastEncoder:
    """One FastEncoder per (model, backend, threads, precision, layers, cache dir) per
    process: the classifier's heads and the retriever share a query encoder."""
    key = (str(model), backend, threads, precision, layers, onnx_cache_dir)
    with _shared_lock:
        enc = _shared.get(key)
        if enc is None:
            enc = _shared[key] = FastEncoder(
                model, backend=backend, threads=threads, precision=precision, layers=layers,
                onnx_cache_dir=onnx_cache_dir,
            )
        return enc


def batch_fast_encoder(
    model: str | Path = DEFAULT_MODEL,
    *,
    threads: int = 2,
    precision: str = "fp32",
    onnx_cache_dir: Path | None = None,
) -> FastEncoder:
    """Encoder for bulk ingestion: ONNX Runtime with `threads` intra-op threads, no cache.

    Ingestion is a batch job, so it may use both cores (queries stay on 1 thread).
    Measured on the 2-core AVX-512 machine, chunks of <= 128 tokens (median 53),
    length-sorted chunks of 8: ~105 chunks/s, against ~40-48 chunks/s through
    sentence-transformers with 2 torch threads. fp32 by default: the stored vectors are
    what every later query is compared with, so they keep the reference's fidelity.
    """
    return FastEncoder(model, threads=threads, cache_size=0, precision=precision,
                       onnx_cache_dir=onnx_cache_dir)
