"""Build toolchain for the encoder's ONNX graphs: export, fusion, SmoothQuant smoothing,
dynamic int8 and blockwise 8-bit quantisation, calibration texts.

The runtime (`shared.encoders.fast.encoder`) imports this module only when a graph it
needs is not in the cache yet (`GraphFiles.ready`); `build_graph` then builds what is
missing. Every step writes its file atomically (temp file + os.replace), so replicas
building the same graph at once each end with a complete file.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from shared.encoders.fast.graphs import GraphFiles, cpu_has_vnni
from shared.encoders.fast.model_dir import load_auto_model

log = logging.getLogger("intentroute.fast_encoder")


def export_onnx(model_dir: Path, out: Path, layers: int | None = None) -> Path:
    """Export `model_dir` (HF/sentence-transformers BERT-like dir) to ONNX, atomically;
    `layers` keeps only the first layers (an early-exit encoder)."""
    import torch

    model = load_auto_model(model_dir, layers, attn_implementation="eager")

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


CALIBRATION_FILE = Path(__file__).with_name("calibration.jsonl")
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
    so.log_severity_level = 3  # errors only: its C++ warnings ask for nothing here
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


def build_graph(model_dir: Path, files: GraphFiles, precision: str, layers: int | None,
                tokenizer: Any) -> Path:
    """Build what is missing of `model_dir`'s graph for `precision` and return the file
    to load. The fused fp32 graph comes first (the plain export when fusion is not
    available); int8 smooths and quantises the unfused export with calibration texts
    tokenised by `tokenizer`; int8-block quantises the fp32 graph chosen."""
    raw, fused = files.raw, files.fused
    path = fused
    if not fused.exists():
        if not raw.exists():
            log.info("exporting %s to %s", model_dir, raw)
            export_onnx(model_dir, raw, layers)
        try:
            cfg = json.loads((model_dir / "config.json").read_text())
            optimize_onnx(raw, fused, num_heads=int(cfg["num_attention_heads"]),
                          hidden_size=int(cfg["hidden_size"]))
        except Exception as exc:  # optimiser missing/unsupported: the plain graph
            log.warning("ONNX graph fusion skipped (%s)", exc)
            path = raw
    if precision == "int8":  # smooth, then quantise the unfused graph
        vnni = cpu_has_vnni()
        q = files.int8(vnni)
        if not q.exists():
            if not raw.exists():
                export_onnx(model_dir, raw, layers)
            log.info("building the int8 graph %s", q)
            batches = [e.ids for e in tokenizer.encode_batch(calibration_texts())]
            smooth_onnx(raw, files.smoothed, batches)
            quantize_onnx(files.smoothed, q, keep_fp32=INT8_FP32_MATMULS,
                          unsigned_weights=not vnni)
            files.smoothed.unlink(missing_ok=True)
        return q
    if precision == "int8-block":
        b = files.int8_block(path)
        if not b.exists():
            blockwise_int8_onnx(path, b)
        return b
    return path
