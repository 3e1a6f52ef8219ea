"""Folders the code renders and the repository commits (docs/asyncapi, deploy/k8s): what
their `--check` finds different from a fresh rendering."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def folder_differences(rendered: Mapping[str, bytes | str], out: Path,
                       owned: str = "") -> list[str]:
    """The paths of `rendered` (relative path -> content) that `out` lacks or holds
    otherwise, in `rendered`'s order; then, sorted, the files under `out` matching the
    glob `owned` (a folder only the renderer writes) that `rendered` has no more.

    Bytes compare byte for byte; text as `read_text` decodes it (UTF-8, any newline)."""
    wrong = [rel for rel, content in rendered.items()
             if not (out / rel).is_file() or _read(out / rel, content) != content]
    stale = sorted(rel for rel in (p.relative_to(out).as_posix() for p in out.glob(owned))
                   if rel not in rendered) if owned else []
    return wrong + stale


def _read(path: Path, like: bytes | str) -> bytes | str:
    return path.read_bytes() if isinstance(like, bytes) else path.read_text(encoding="utf-8")
