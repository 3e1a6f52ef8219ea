"""Fast single-message sentence encoder (same vectors as `SentenceTransformerEncoder`).

Per-query latency matters for the classifier's Layer 2 and the retriever's query
embedding. sentence-transformers costs ~8-19 ms per message on this CPU; most of it
is framework overhead around a tiny (6 x 384) transformer. `FastEncoder`:

* tokenises with the Rust `tokenizers` fast path (no padding for a single message,
  dynamic padding to the longest text for a batch, texts sorted by length),
* runs the transformer with ONNX Runtime (fp32, graph optimisations on, 1 thread by
  default) when `onnxruntime` (+ `onnx` for the export) is installed; the graph is
  exported once from the model directory, fused (attention, SkipLayerNorm, BiasGelu
  via onnxruntime.transformers) and cached on disk ($INTENTROUTE_ONNX_CACHE or
  ~/.cache/intentroute/onnx, keyed by the weights' name/size/mtime; a model dir under
  the temp dir keeps its graph in `dir/onnx/`, so a temporary fine-tune cleans up
  with its dir); otherwise it falls back to calling the Hugging Face model directly
  under `torch.inference_mode` (no sentence-transformers wrapper),
* mean-pools over the attention mask and L2-normalises, exactly like the reference
  model's Pooling + Normalize modules (cosine with the reference >= 0.9999),
* keeps an LRU cache of recent texts (repeated queries cost a dict lookup).

Measured on the 2-core AVX-512/VNNI machine (1 thread, p50 per message, project-length
queries): FastEncoder fp32 ~6.2-6.9 ms, int8 ~2.8-3.1 ms. int8 (`precision="int8"`
or $INTENTROUTE_ENCODER_PRECISION=int8) is opt-in. Plain dynamic int8 MatMuls put
cosine with the reference at 0.992 mean / 0.955 worst line (per-tensor activation
scales vs a few outlier channels); the int8 graph is therefore SmoothQuant-smoothed
(`smooth_onnx`, calibrated on `encoder_calibration.jsonl`) with layer 0's FFN output
MatMul left in fp32: 0.998 mean / 0.991 worst on the held-out routing-eval queries,
0.9955 worst on SciFact abstracts. The shipped head was trained on fp32 vectors: with
int8 the routing eval moves 2 low-confidence fallback guesses (0.972 -> 0.965).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from shared.embeddings import DEFAULT_MODEL, Vectors, resolve_model_path

log = logging.getLogger("intentroute.fast_encoder")

ONNX_CACHE_ENV = "INTENTROUTE_ONNX_CACHE"


def onnxruntime_available() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def _default_cache_dir() -> Path:
    env = os.environ.get(ONNX_CACHE_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "intentroute" / "onnx"


def _weights_file(model_dir: Path) -> Path:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (model_dir / name).exists():
            return model_dir / name
    raise FileNotFoundError(f"no model weights in {model_dir}")


def _model_key(model_dir: Path) -> str:
    w = _weights_file(model_dir)
    st = w.stat()
    # Content-ish key (not the path): a copied encoder dir keeps its key.
    raw = f"{w.name}|{st.st_size}|{st.st_mtime_ns}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _max_seq_length(model_dir: Path, default: int = 256) -> int:
    cfg = model_dir / "sentence_bert_config.json"
    if cfg.exists():
        try:
            return int(json.loads(cfg.read_text()).get("max_seq_length") or default)
        except (ValueError, OSError):
            pass
    return default


def _check_mean_pooling(model_dir: Path) -> None:
    cfg = model_dir / "1_Pooling" / "config.json"
    if cfg.exists():
        pooling = json.loads(cfg.read_text())
        if not pooling.get("pooling_mode_mean_tokens", True) or pooling.get(
            "pooling_mode_cls_token"
        ):
            raise ValueError(f"{model_dir}: FastEncoder only implements mean pooling")


_EMBEDDING_PARTS = ("word_embeddings.weight", "position_embeddings.weight",
                    "token_type_embeddings.weight", "LayerNorm.weight", "LayerNorm.bias")


def load_embedding_module(model_dir: Path) -> dict[str, Any]:
    """The transformer's embedding module (its "layer 0") as numpy arrays: word,
    position and token-type tables, LayerNorm weight/bias/eps and the position offset
    (RoBERTa-style models count positions from padding_idx + 1)."""
    def wanted(keys: Iterable[str]) -> dict[str, str]:  # part -> the file's key for it
        return {part: key for key in keys for part in _EMBEDDING_PARTS
                if key.endswith(f"embeddings.{part}")}

    w = _weights_file(model_dir)
    found: dict[str, np.ndarray]
    if w.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(w), framework="np") as f:  # reads only these tensors
            found = {part: f.get_tensor(key) for part, key in wanted(f.keys()).items()}
    else:
        import torch

        state = torch.load(str(w), map_location="cpu", weights_only=True)
        found = {part: state[key].float().numpy() for part, key in wanted(state).items()}
    missing = [p for p in _EMBEDDING_PARTS if p not in found]
    if missing:
        raise ValueError(f"{model_dir}: no embedding module weights {missing}")
    cfg = json.loads((model_dir / "config.json").read_text())
    roberta = "roberta" in str(cfg.get("model_type", ""))
    return {
        "word": found["word_embeddings.weight"].astype(np.float32),
        # Position and token type 0 are added to every token: pre-add them once.
        "position": (found["position_embeddings.weight"]
                     + found["token_type_embeddings.weight"][0]).astype(np.float32),
        "ln_weight": found["LayerNorm.weight"].astype(np.float32),
        "ln_bias": found["LayerNorm.bias"].astype(np.float32),
        "eps": float(cfg.get("layer_norm_eps", 1e-12)),
        "position_offset": int(cfg.get("pad_token_id", 1)) + 1 if roberta else 0,
    }


def _load_auto_model(model_dir: Path, layers: int | None, **kw: Any) -> Any:
    """The transformer, keeping only its first `layers` layers when set."""
    from transformers import AutoModel

    if layers:
        kw["num_hidden_layers"] = layers
    return AutoModel.from_pretrained(str(model_dir), **kw).eval()


def export_onnx(model_dir: Path, out: Path, layers: int | None = None) -> Path:
    """Export `model_dir` (HF/sentence-transformers BERT-like dir) to ONNX, atomically;
    `layers` keeps only the first layers (an early-exit encoder)."""
    import torch

    model = _load_auto_model(model_dir, layers, attn_implementation="eager")

    class _Hidden(torch.nn.Module):
        def __init__(self, m: Any) -> None:
            super().__init__()
            self.m = m

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.tensor([[101, 7592, 2045, 2129, 2024, 2017, 102]], dtype=torch.long)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _Hidden(model),
            (ids, torch.ones_like(ids)),
            str(tmp),
            input_names=["input_ids", "attention_mask"],
            output_names=["hidden"],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "seq"},
                "attention_mask": {0: "batch", 1: "seq"},
                "hidden": {0: "batch", 1: "seq"},
            },
            opset_version=17,
            dynamo=False,
        )
    os.replace(tmp, out)
    return out


def optimize_onnx(src: Path, out: Path, *, num_heads: int, hidden_size: int) -> Path:
    """Fuse attention / SkipLayerNorm / BiasGelu (onnxruntime.transformers), atomically."""
    from onnxruntime.transformers import optimizer

    model = optimizer.optimize_model(
        str(src), model_type="bert", num_heads=num_heads, hidden_size=hidden_size,
        opt_level=1, use_gpu=False,
    )
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    model.save_model_to_file(str(tmp))
    os.replace(tmp, out)
    return out


CALIBRATION_FILE = Path(__file__).with_name("encoder_calibration.jsonl")
# SmoothQuant migration strength: 0.8 gave the best worst-line cosine (0.5: worse than
# no smoothing, 1.0: worse again).
SMOOTH_ALPHA = 0.8
# MatMuls left in fp32 in the int8 graph: layer 0's FFN output carries most of the
# remaining error (min cosine 0.97 -> 0.99 when it alone stays fp32).
INT8_FP32_MATMULS = ("/encoder/layer.0/output/dense/MatMul",)


def calibration_texts() -> list[str]:
    """300 project lines (classifier training queries, kb/avap chunks) for int8 scales."""
    with CALIBRATION_FILE.open(encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def smooth_onnx(src: Path, out: Path, batches: list[list[int]], *,
                alpha: float = SMOOTH_ALPHA) -> Path:
    """SmoothQuant (Xiao et al. 2023) on the weight MatMuls, exact in fp32, atomically.

    Dynamic int8 quantises each activation with one scale per tensor, so the few
    channels with outlier magnitudes leave the rest with a handful of levels. For every
    group of MatMuls sharing an input x, with per-channel maxima a_j (over `batches`,
    token ids of calibration texts) and w_j (over the group's weight rows), this inserts
    x * (1/s) and scales weight row j by s_j = a_j^alpha / w_j^(1 - alpha).
    """
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    inits = {i.name: i for i in model.graph.initializer}
    groups: dict[str, list[Any]] = {}
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.input[1] in inits:
            groups.setdefault(node.input[0], []).append(node)
    names = list(groups)

    probe = onnx.load(str(src))
    for name in names:
        probe.graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT,
                                                                None))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(probe.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    amax: dict[str, np.ndarray] = {}
    for ids in batches:
        arr = np.asarray([ids], dtype=np.int64)
        outs = session.run(names, {"input_ids": arr, "attention_mask": np.ones_like(arr)})
        for name, value in zip(names, outs, strict=True):
            a = np.abs(value).reshape(-1, value.shape[-1]).max(axis=0)
            amax[name] = np.maximum(amax[name], a) if name in amax else a

    for name, nodes in groups.items():
        weights = [numpy_helper.to_array(inits[n.input[1]]) for n in nodes]
        wmax = np.max([np.abs(w).max(axis=1) for w in weights], axis=0)
        scale = (np.maximum(amax[name], 1e-5) ** alpha
                 / np.maximum(wmax, 1e-5) ** (1 - alpha)).astype(np.float32)
        inv = numpy_helper.from_array((1.0 / scale).astype(np.float32), f"{name}/smooth_inv")
        model.graph.initializer.append(inv)
        first = min(list(model.graph.node).index(n) for n in nodes)
        model.graph.node.insert(first, helper.make_node(
            "Mul", [name, inv.name], [f"{name}/smoothed"], name=f"{name}/smooth"))
        for n, w in zip(nodes, weights, strict=True):
            inits[n.input[1]].CopyFrom(
                numpy_helper.from_array((w * scale[:, None]).astype(np.float32), n.input[1]))
            n.input[0] = f"{name}/smoothed"
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp.onnx")
    onnx.save(model, str(tmp))
    os.replace(tmp, out)
    return out


def cpu_has_vnni() -> bool:
    """x86 VNNI (AVX512-VNNI or AVX-VNNI): u8 x s8 dot products without int16 saturation."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


def quantize_onnx(src: Path, out: Path, keep_fp32: tuple[str, ...] = (),
                  unsigned_weights: bool = False) -> Path:
    """int8 dynamic quantisation (per-channel weights) of the MatMuls, atomically.

    MatMuls whose node name ends with one of `keep_fp32` stay fp32. `unsigned_weights`
    (u8 x u8) is for CPUs without VNNI: their u8 x s8 kernels saturate in int16
    (cosine with fp32 fell from 0.99 to 0.98 on an AVX2-only EPYC).
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    exclude = [n.name for n in onnx.load(str(src), load_external_data=False).graph.node
               if n.op_type == "MatMul" and n.name.endswith(keep_fp32)] if keep_fp32 else []
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp.onnx")
    quantize_dynamic(str(src), str(tmp),
                     weight_type=QuantType.QUInt8 if unsigned_weights else QuantType.QInt8,
                     per_channel=True, op_types_to_quantize=["MatMul"],
                     nodes_to_exclude=exclude)
    os.replace(tmp, out)
    return out


def blockwise_int8_onnx(src: Path, out: Path, *, block_size: int = 32) -> Path:
    """Weight MatMuls -> MatMulNBits (8-bit weights, one scale per `block_size` input
    rows, symmetric; accuracy_level 4 = int8 compute with activations quantised per row
    and block), atomically. Per-block activation scales keep outlier channels from
    flattening the rest, so the vectors stay within ~1e-3 cosine of fp32; a quarter of
    the weight bytes is what makes single-message inference faster (it streams the
    weights from memory). Single messages only: on length-sorted batches of 8 (ingest,
    2 threads) it ran ~59 chunks/s against ~99 for fp32."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    inits = {i.name: i for i in model.graph.initializer}
    nodes = list(model.graph.node)
    for pos, node in enumerate(nodes):
        if node.op_type != "MatMul" or node.input[1] not in inits:
            continue
        w = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
        k, n = w.shape
        if k % block_size:
            continue
        blocks = w.T.reshape(n, k // block_size, block_size)
        scale = np.abs(blocks).max(axis=-1) / 127.0
        scale[scale == 0] = 1.0
        q = np.clip(np.round(blocks / scale[..., None]), -128, 127).astype(np.int16) + 128
        qname, sname = f"{node.input[1]}/q8", f"{node.input[1]}/q8_scale"
        model.graph.initializer.extend([
            numpy_helper.from_array(q.astype(np.uint8), qname),
            numpy_helper.from_array(scale.astype(np.float32).reshape(-1), sname),
        ])
        nodes[pos] = helper.make_node(
            "MatMulNBits", [node.input[0], qname, sname], list(node.output),
            name=f"{node.name}/q8", domain="com.microsoft", K=k, N=n, bits=8,
            block_size=block_size, accuracy_level=4)
    used = {i for node in nodes for i in node.input}
    kept = [i for i in model.graph.initializer if i.name in used]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp.onnx")
    onnx.save(model, str(tmp))
    os.replace(tmp, out)
    return out


PRECISIONS = ("fp32", "int8", "int8-block")


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
    reference ~0.998 mean / ~0.99 worst line: opt-in, train the head with the same
    setting).
    """

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
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import tokenizers

        self.model_name = str(model)
        self.model_dir = Path(resolve_model_path(str(model)))
        _check_mean_pooling(self.model_dir)
        self.max_length = max_length or _max_seq_length(self.model_dir)
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
    def _init_onnx(self, explicit_cache: Path | None) -> None:
        import onnxruntime as ort

        cache_dir = explicit_cache or _default_cache_dir()
        key = _model_key(self.model_dir) + (f"-L{self.layers}" if self.layers else "")
        if explicit_cache is None and self.model_dir.resolve().is_relative_to(
            Path(tempfile.gettempdir()).resolve()
        ):
            cache_dir = self.model_dir / "onnx"  # a temporary fine-tune keeps its graph
        raw = cache_dir / f"{self.model_dir.name}-{key}.onnx"
        fused = cache_dir / f"{self.model_dir.name}-{key}-fused.onnx"
        path = fused
        if not fused.exists():
            if not raw.exists():
                log.info("exporting %s to %s", self.model_dir, raw)
                export_onnx(self.model_dir, raw, self.layers)
            try:
                cfg = json.loads((self.model_dir / "config.json").read_text())
                optimize_onnx(raw, fused, num_heads=int(cfg["num_attention_heads"]),
                              hidden_size=int(cfg["hidden_size"]))
            except Exception as exc:  # optimiser missing/unsupported: the plain graph
                log.warning("ONNX graph fusion skipped (%s)", exc)
                path = raw
        if self.precision == "int8":  # smooth, then quantise the unfused graph
            vnni = cpu_has_vnni()
            q = cache_dir / f"{self.model_dir.name}-{key}-int8s{'' if vnni else '-u8'}.onnx"
            if not q.exists():
                if not raw.exists():
                    export_onnx(self.model_dir, raw, self.layers)
                smoothed = cache_dir / f"{self.model_dir.name}-{key}-smooth.onnx"
                log.info("building the int8 graph %s", q)
                batches = [e.ids for e in self._tok.encode_batch(calibration_texts())]
                smooth_onnx(raw, smoothed, batches)
                quantize_onnx(smoothed, q, keep_fp32=INT8_FP32_MATMULS,
                              unsigned_weights=not vnni)
                smoothed.unlink(missing_ok=True)
            path = q
        elif self.precision == "int8-block":  # the fused graph (or the plain one)
            b = cache_dir / f"{path.stem}-int8block.onnx"
            if not b.exists():
                blockwise_int8_onnx(path, b)
            path = b
        so = ort.SessionOptions()
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
            return self._session.run(None, {"input_ids": ids, "attention_mask": mask})[0]

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
            return (x - mean) / np.sqrt(var + eps) * gamma + beta

        self._run = run

    def _init_torch(self) -> None:
        import torch

        model = _load_auto_model(self.model_dir, self.layers)
        self._torch_model = model

        def run(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                out = model(
                    input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)
                ).last_hidden_state
            return out.numpy()

        self._run = run

    # -- Encoder protocol -----------------------------------------------------------
    @property
    def dim(self) -> int:
        return self._dim

    def _forward(self, batch_ids: list[list[int]]) -> np.ndarray:
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
        return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)

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


PRECISION_ENV = "INTENTROUTE_ENCODER_PRECISION"

_shared: dict[tuple[str, str, int, str, int | None], FastEncoder] = {}
_shared_lock = threading.Lock()


def shared_fast_encoder(
    model: str | Path = DEFAULT_MODEL,
    *,
    backend: str = "auto",
    threads: int = 1,
    precision: str | None = None,
    layers: int | None = None,
) -> FastEncoder:
    """One FastEncoder per (model, backend, threads, precision, layers) per process.

    precision defaults to $INTENTROUTE_ENCODER_PRECISION or "fp32".
    """
    precision = precision or os.environ.get(PRECISION_ENV, "fp32")
    key = (str(model), backend, threads, precision, layers)
    with _shared_lock:
        enc = _shared.get(key)
        if enc is None:
            enc = _shared[key] = FastEncoder(
                model, backend=backend, threads=threads, precision=precision, layers=layers
            )
        return enc


INGEST_THREADS = 2
INGEST_PRECISION_ENV = "INTENTROUTE_INGEST_PRECISION"


def batch_fast_encoder(
    model: str | Path = DEFAULT_MODEL,
    *,
    threads: int = INGEST_THREADS,
    precision: str | None = None,
) -> FastEncoder:
    """Encoder for bulk ingestion: ONNX Runtime with `threads` intra-op threads, no cache.

    Ingestion is a batch job, so it may use both cores (queries stay on 1 thread).
    Measured on the 2-core AVX-512 machine, chunks of <= 128 tokens (median 53),
    length-sorted chunks of 8: ~105 chunks/s, against ~40-48 chunks/s through
    sentence-transformers with 2 torch threads. fp32 by default: the stored vectors are
    what every later query is compared with, so they keep the reference's fidelity.
    """
    precision = precision or os.environ.get(INGEST_PRECISION_ENV, "fp32")
    return FastEncoder(model, threads=threads, cache_size=0, precision=precision)
