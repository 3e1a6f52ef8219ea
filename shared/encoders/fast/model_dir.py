"""What the encoder reads from a sentence-transformers model directory: the weights
file (and a cache key from it), the sequence bound, the pooling mode, the embedding
module's tables, and the Hugging Face transformer itself."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np


def weights_file(model_dir: Path) -> Path:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (model_dir / name).exists():
            return model_dir / name
    raise FileNotFoundError(f"no model weights in {model_dir}")


def model_key(model_dir: Path) -> str:
    w = weights_file(model_dir)
    st = w.stat()
    # Content-ish key (not the path): a copied encoder dir keeps its key.
    raw = f"{w.name}|{st.st_size}|{st.st_mtime_ns}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def max_seq_length(model_dir: Path, default: int = 256) -> int:
    cfg = model_dir / "sentence_bert_config.json"
    if cfg.exists():
        try:
            return int(json.loads(cfg.read_text()).get("max_seq_length") or default)
        except (ValueError, OSError):
            pass
    return default


def check_mean_pooling(model_dir: Path) -> None:
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
    (RoBERTa-style models and MPNet count positions from padding_idx + 1; MPNet has no
    token-type table)."""
    def wanted(keys: Iterable[str]) -> dict[str, str]:  # part -> the file's key for it
        return {part: key for key in keys for part in _EMBEDDING_PARTS
                if key.endswith(f"embeddings.{part}")}

    w = weights_file(model_dir)
    found: dict[str, np.ndarray]
    if w.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(w), framework="np") as f:  # reads only these tensors
            found = {part: f.get_tensor(key) for part, key in wanted(f.keys()).items()}
    else:
        import torch

        state = torch.load(str(w), map_location="cpu", weights_only=True)
        found = {part: state[key].float().numpy() for part, key in wanted(state).items()}
    cfg = json.loads((model_dir / "config.json").read_text())
    model_type = str(cfg.get("model_type", ""))
    optional = ("token_type_embeddings.weight",) if model_type == "mpnet" else ()
    missing = [p for p in _EMBEDDING_PARTS if p not in found and p not in optional]
    if missing:
        raise ValueError(f"{model_dir}: no embedding module weights {missing}")
    offset_positions = "roberta" in model_type or model_type == "mpnet"
    token_type = (found["token_type_embeddings.weight"][0]
                  if "token_type_embeddings.weight" in found else 0.0)
    return {
        "word": found["word_embeddings.weight"].astype(np.float32),
        # Position and token type 0 are added to every token: pre-add them once.
        "position": (found["position_embeddings.weight"] + token_type).astype(np.float32),
        "ln_weight": found["LayerNorm.weight"].astype(np.float32),
        "ln_bias": found["LayerNorm.bias"].astype(np.float32),
        "eps": float(cfg.get("layer_norm_eps", 1e-12)),
        "position_offset": int(cfg.get("pad_token_id", 1)) + 1 if offset_positions else 0,
    }


def load_auto_model(model_dir: Path, layers: int | None, **kw: Any) -> Any:
    """The transformer from the local directory (never the hub), keeping only its
    first `layers` layers when set."""
    from transformers import AutoModel

    if layers:
        kw["num_hidden_layers"] = layers
    return AutoModel.from_pretrained(str(model_dir), local_files_only=True, **kw).eval()
