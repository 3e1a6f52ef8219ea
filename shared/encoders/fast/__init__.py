"""Fast sentence encoder: the runtime (`encoder`), the model directory it reads
(`model_dir`), the on-disk graph cache (`graphs`), and the ONNX build toolchain
(`build`, imported only when a graph must be built)."""

from shared.encoders.fast.encoder import (
    PRECISIONS,
    FastEncoder,
    batch_fast_encoder,
    onnxruntime_available,
    shared_fast_encoder,
)
from shared.encoders.fast.model_dir import load_embedding_module

__all__ = [
    "PRECISIONS",
    "FastEncoder",
    "batch_fast_encoder",
    "load_embedding_module",
    "onnxruntime_available",
    "shared_fast_encoder",
]
