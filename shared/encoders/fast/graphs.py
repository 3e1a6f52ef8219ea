"""Where a model's ONNX graphs are cached, one file per build step and precision.

For a model directory `m` (weights key `k`, optionally cut to `L` layers) the cache
holds `m-k[-LL].onnx` (the export), `...-fused.onnx` (attention / SkipLayerNorm /
BiasGelu fused), `...-int8s.onnx` (smoothed dynamic int8; `-int8s-u8.onnx` on CPUs
without VNNI) and `...-fused-int8block.onnx` (blockwise 8-bit weights of the fused
graph, or `...-int8block.onnx` of the plain one when fusion is unavailable).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from shared.encoders.fast.model_dir import model_key


def cpu_has_vnni() -> bool:
    """x86 VNNI (AVX512-VNNI or AVX-VNNI): u8 x s8 dot products without int16 saturation."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


@dataclass(frozen=True)
class GraphFiles:
    cache_dir: Path
    stem: str

    @classmethod
    def for_model(cls, model_dir: Path, layers: int | None,
                  cache_dir: Path | None = None) -> GraphFiles:
        """`cache_dir` None: ~/.cache/intentroute/onnx, except that a model directory
        under the temp dir keeps its graphs in `dir/onnx/` (a temporary fine-tune cleans
        up with its directory)."""
        if cache_dir is None:
            cache_dir = Path.home() / ".cache" / "intentroute" / "onnx"
            if model_dir.resolve().is_relative_to(Path(tempfile.gettempdir()).resolve()):
                cache_dir = model_dir / "onnx"
        key = model_key(model_dir) + (f"-L{layers}" if layers else "")
        return cls(cache_dir, f"{model_dir.name}-{key}")

    @property
    def raw(self) -> Path:
        return self.cache_dir / f"{self.stem}.onnx"

    @property
    def fused(self) -> Path:
        return self.cache_dir / f"{self.stem}-fused.onnx"

    @property
    def smoothed(self) -> Path:
        return self.cache_dir / f"{self.stem}-smooth.onnx"

    def int8(self, vnni: bool) -> Path:
        return self.cache_dir / f"{self.stem}-int8s{'' if vnni else '-u8'}.onnx"

    def int8_block(self, base: Path) -> Path:
        return self.cache_dir / f"{base.stem}-int8block.onnx"

    def ready(self, precision: str) -> Path | None:
        """The graph to load for `precision` when every step is already on disk, else
        None (the build then completes what is missing, fusion first)."""
        if not self.fused.exists():
            return None
        if precision == "int8":
            path = self.int8(cpu_has_vnni())
        elif precision == "int8-block":
            path = self.int8_block(self.fused)
        else:
            path = self.fused
        return path if path.exists() else None
