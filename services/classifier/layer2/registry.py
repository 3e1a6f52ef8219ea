"""The head registry as the worker reads it, and its first head.

Layout under `root`: one directory per version (`v0001/`, `v0002/`, ...) and a `CURRENT`
file naming the promoted one, replaced atomically. Workers read CURRENT and hot-reload
when it changes; versions are added and promoted offline
(`offline.classifier.promote.HeadWriter`).

The registry lives outside the installed package (default `<state dir>/heads`): a head
promoted into site-packages would be lost on reinstall. The package ships one head,
`SHIPPED_HEADS`, copied into an empty registry by `seed_registry`.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path

from services.classifier.layer2.head import EmbeddingHead

log = logging.getLogger("intentroute.classifier.registry")

POINTER = "CURRENT"
VERSION_PREFIX = "v"
SHIPPED_HEADS = Path(__file__).resolve().parent.parent / "heads"


def is_version(name: str) -> bool:
    return name.startswith(VERSION_PREFIX) and name[1:].isdigit()


def write_pointer(root: Path, version: str, *, replace: bool = True) -> bool:
    """Point `root/CURRENT` at `version` atomically (readers see the old or the new
    name, never a partial file). With `replace=False` an existing pointer is kept;
    returns whether this call wrote it."""
    pointer = root / POINTER
    tmp = root / f".{POINTER}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w") as f:
        f.write(version + "\n")
        f.flush()
        os.fsync(f.fileno())
    try:
        if replace:
            os.replace(tmp, pointer)
            return True
        try:
            os.link(tmp, pointer)  # fails if a pointer appeared meanwhile
        except FileExistsError:
            return False
        return True
    finally:
        tmp.unlink(missing_ok=True)


def seed_registry(root: Path, shipped: Path = SHIPPED_HEADS) -> str | None:
    """Give a registry without CURRENT the shipped CURRENT head; returns the version it
    seeded (None: `root` already had a current head). Safe when several workers start
    at once: the copy is staged in a temporary directory and renamed into place, and
    the pointer is only created, never replaced."""
    root = Path(root)
    if (root / POINTER).exists():
        return None
    version = (shipped / POINTER).read_text().strip()
    root.mkdir(parents=True, exist_ok=True)
    target = root / version
    if not (target / "head.json").exists():
        staging = Path(tempfile.mkdtemp(prefix=".seed-", dir=root))
        try:
            shutil.copytree(shipped / version, staging / version)
            try:
                os.rename(staging / version, target)
            except OSError:  # another worker renamed its copy first
                if not (target / "head.json").exists():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    if not write_pointer(root, version, replace=False):
        return None
    log.info("[classifier] seeded head registry %s with the shipped head %s", root, version)
    return version


class HeadRegistry:
    """Read side of the versioned heads under `root`: the current head, hot reload."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()
        self._loaded_version: str | None = None
        self._loaded_head: EmbeddingHead | None = None
        self._pointer_stamp: tuple[int, int] | None = None

    @property
    def pointer(self) -> Path:
        return self.root / POINTER

    def versions(self) -> list[str]:
        if not self.root.exists():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and is_version(p.name))

    @property
    def current_version(self) -> str | None:
        """The version CURRENT names now (None: no head promoted yet)."""
        try:
            v = self.pointer.read_text().strip()
        except FileNotFoundError:
            return None
        return v or None

    def load_version(self, version: str) -> EmbeddingHead:
        return EmbeddingHead.load(self.root / version)

    def current(self) -> EmbeddingHead | None:
        version = self.current_version
        if version is None:
            return None
        with self._lock:
            if version != self._loaded_version:
                self._loaded_head = self.load_version(version)
                self._loaded_version = version
                self._pointer_stamp = self._stamp()
            return self._loaded_head

    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = self.pointer.stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_ino)

    def maybe_reload(self) -> bool:
        """Cheap check (one stat) for a newly promoted head; load it if there is one."""
        stamp = self._stamp()
        if stamp == self._pointer_stamp and self._loaded_version is not None:
            return False
        version = self.current_version
        self._pointer_stamp = stamp
        if version is None or version == self._loaded_version:
            return False
        head = self.load_version(version)
        with self._lock:
            self._loaded_head, self._loaded_version = head, version
        log.info("[classifier] loaded embedding head %s", version)
        return True

    @property
    def loaded_version(self) -> str | None:
        return self._loaded_version
