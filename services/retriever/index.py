"""Embedded, in-process hybrid index, read side: bm25s (lexical) + dense vectors, fused
as `fusion` says. Ingest writes it (`indexing.embedded_ingest`).

On-disk layout (one directory per ingest, swapped atomically)::

    index_dir/
      CURRENT            -> text file naming the live version directory ("v000003")
      v000003/
        manifest.json    version, encoder, BM25 settings, counts, ingest report
        chunks.msgpack   list[Chunk] (row i of vectors.npy is chunk i)
        vectors.npy      float32 (n_chunks, dim), L2-normalised
        bm25/            bm25s index files

A writer publishes a complete version directory and then points CURRENT at it, so a
reader sees either the old or the new index, never half of one. A reader that read
CURRENT just before a swap can still open what it read: old versions are kept a while.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt

from services.retriever.bm25 import Bm25Config, Bm25Tokenizer
from services.retriever.fusion import FusionSettings, fuse
from services.retriever.indexing.chunking import Chunk
from services.retriever.ports import SearchResult, check_method
from services.retriever.rrf import rrf
from shared.contracts.pipeline import Passage
from shared.encoders.embeddings import Encoder

log = logging.getLogger(__name__)

CURRENT_FILE = "CURRENT"
MANIFEST_FILE = "manifest.json"
CHUNKS_FILE = "chunks.msgpack"
VECTORS_FILE = "vectors.npy"
BM25_DIR = "bm25"

_HEADING_WORD = re.compile(r"[a-z_][a-z0-9_]{2,}")
_QUERY_WORD = re.compile(r"[a-z_][a-z0-9_]{2,}")


def read_current(index_dir: Path) -> str | None:
    """The live version's directory name, None before the first ingest."""
    try:
        name = (Path(index_dir) / CURRENT_FILE).read_text().strip()
    except FileNotFoundError:
        return None
    return name or None


def encoder_name(encoder: Encoder) -> str:
    return str(getattr(encoder, "model_name", type(encoder).__qualname__))


class Scores(NamedTuple):
    """Every chunk's BM25 score (zeros for "dense") and cosine (None for "bm25"), and
    the query vector (None for "bm25")."""

    bm25: npt.NDArray[np.float32]
    dense: npt.NDArray[np.float32] | None
    query_vector: npt.NDArray[np.float32] | None


@dataclass(frozen=True)
class Snapshot:
    """Everything one version needs for search; swapped as a whole on reload."""

    name: str
    path: Path
    manifest: dict[str, Any]
    chunks: list[Chunk]
    vectors: npt.NDArray[np.float32]
    bm25: Any
    tokenizer: Bm25Tokenizer

    @property
    def version(self) -> int:
        return int(self.manifest["version"])

    @classmethod
    def load(cls, index_dir: Path, name: str) -> Snapshot:
        import bm25s

        path = index_dir / name
        manifest = json.loads((path / MANIFEST_FILE).read_text())
        chunks = msgspec.msgpack.decode((path / CHUNKS_FILE).read_bytes(), type=list[Chunk])
        vectors = np.load(path / VECTORS_FILE, mmap_mode="r")
        config = msgspec.convert(manifest["bm25"], Bm25Config)
        retriever = bm25s.BM25.load(str(path / BM25_DIR), mmap=True, show_progress=False)
        if len(chunks) != vectors.shape[0]:
            raise ValueError(f"{path}: {len(chunks)} chunks but {vectors.shape[0]} vectors")
        return cls(name, path, manifest, chunks, vectors, retriever, Bm25Tokenizer(config))


def load_current(index_dir: Path, attempts: int = 5) -> Snapshot:
    last: Exception | None = None
    for _ in range(attempts):
        name = read_current(index_dir)
        if name is None:
            raise FileNotFoundError(f"no index at {index_dir} (missing {CURRENT_FILE})")
        try:
            return Snapshot.load(index_dir, name)
        except FileNotFoundError as e:  # swapped and collected between read and open
            last = e
            time.sleep(0.05)
    raise RuntimeError(f"could not open a stable version of {index_dir}") from last


def _top(scores: npt.NDArray[np.float32], depth: int, positive_only: bool) -> npt.NDArray[Any]:
    """Indices of the `depth` best scores, best first, ties by row (deterministic)."""
    n = scores.shape[0]
    if n == 0 or depth <= 0:
        return np.empty(0, dtype=np.int64)
    if depth < n:
        cand = np.argpartition(-scores, depth - 1)[:depth]
        # argpartition may cut inside a tie: take every row tied with the cut-off score.
        cut = scores[cand].min()
        cand = np.flatnonzero(scores >= cut)
    else:
        cand = np.arange(n)
    if positive_only:
        cand = cand[scores[cand] > 0]
    order = np.lexsort((cand, -scores[cand]))
    result: npt.NDArray[Any] = cand[order][:depth]
    return result


class EmbeddedIndex:
    """Read-only view of the live version in `index_dir`; `maybe_reload` follows ingests.

    Synchronous: the worker reaches it through `embedded.EmbeddedRetrieval`; offline
    evaluation searches it directly, every method with one query vector."""

    def __init__(self, index_dir: Path, encoder: Encoder | None, snapshot: Snapshot,
                 settings: FusionSettings) -> None:
        self.index_dir = Path(index_dir)
        self.encoder = encoder
        self.settings = settings
        self._snap = snapshot
        self._headings: dict[str, dict[str, list[int]]] = {}
        self._check_encoder(snapshot)

    @classmethod
    def open(cls, index_dir: Path, encoder: Encoder | None,
             settings: FusionSettings | None = None) -> EmbeddedIndex:
        return cls(index_dir, encoder, load_current(Path(index_dir)),
                   settings or FusionSettings())

    def _check_encoder(self, snap: Snapshot) -> None:
        if self.encoder is None:
            return
        want = snap.manifest["encoder"]
        if int(self.encoder.dim) != int(want["dim"]):
            raise ValueError(
                f"encoder dim {self.encoder.dim} != index dim {want['dim']} ({want['name']})"
            )
        if encoder_name(self.encoder) != want["name"]:
            log.warning("index embedded with %s, querying with %s", want["name"],
                        encoder_name(self.encoder))

    def _named_sections(self, snap: Snapshot, query: str) -> list[int]:
        """Rows of Markdown sections whose one-word heading appears in the query."""
        headings = self._headings.get(snap.name)
        if headings is None:
            headings = {}
            for row, chunk in enumerate(snap.chunks):
                if not chunk.source.endswith((".md", ".markdown")) or not chunk.title:
                    continue
                head = chunk.title.rsplit(" > ", 1)[-1].strip("`() ").lower()
                if _HEADING_WORD.fullmatch(head):
                    headings.setdefault(head, []).append(row)
            self._headings = {snap.name: headings}
        rows: list[int] = []
        for word in _QUERY_WORD.findall(query.lower()):
            for row in headings.get(word, ()):
                if row not in rows:
                    rows.append(row)
        return rows

    # -- state ---------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._snap.version

    @property
    def manifest(self) -> dict[str, Any]:
        return self._snap.manifest

    @property
    def chunks(self) -> list[Chunk]:
        return self._snap.chunks

    def __len__(self) -> int:
        return len(self._snap.chunks)

    def stale(self) -> bool:
        """CURRENT names another version than the one loaded (one small file read)."""
        name = read_current(self.index_dir)
        return name is not None and name != self._snap.name

    def maybe_reload(self) -> bool:
        """Reload if CURRENT names another version; a failed reload keeps serving the
        old version."""
        if not self.stale():
            return False
        try:
            snap = load_current(self.index_dir)
            self._check_encoder(snap)
        except Exception:
            log.exception("reload of %s failed; keeping %s", self.index_dir, self._snap.name)
            return False
        self._snap = snap  # one reference swap: in-flight searches keep the old snapshot
        return True

    # -- query ---------------------------------------------------------------

    def _encode_query(self, query: str) -> npt.NDArray[np.float32]:
        if self.encoder is None:
            raise RuntimeError(
                "dense/hybrid search needs an encoder: open the index with one, or pass "
                "query_vector (method='bm25' works without)"
            )
        return np.asarray(self.encoder.encode([query], batch_size=1)[0], dtype=np.float32)

    def scores(self, query: str, method: str = "hybrid",
               query_vector: npt.NDArray[np.float32] | None = None) -> Scores:
        """Every chunk's BM25 score and cosine for `query` (offline evaluation)."""
        return self._scores(self._snap, query, method, query_vector)

    def _scores(self, snap: Snapshot, query: str, method: str,
                qv: npt.NDArray[np.float32] | None) -> Scores:
        n = len(snap.chunks)
        if qv is None and method != "bm25":  # bm25 alone doesn't pay for an embedding
            qv = self._encode_query(query)
        sims = None
        if qv is not None and n:
            sims = np.asarray(snap.vectors @ np.asarray(qv, dtype=np.float32), dtype=np.float32)
        bm25_all = np.zeros(n, dtype=np.float32)
        if method != "dense" and n:
            ids = snap.bm25.get_tokens_ids(snap.tokenizer(query))
            if ids:
                bm25_all = np.asarray(snap.bm25.get_scores_from_ids(ids), dtype=np.float32)
        return Scores(bm25_all, sims, qv)

    def _hybrid(self, snap: Snapshot, query: str, k: int, bm25_all: npt.NDArray[np.float32],
                sims: npt.NDArray[np.float32], fusion: FusionSettings
                ) -> tuple[npt.NDArray[np.int64], list[float], float]:
        """(rows, fused scores, RRF score of the first row) of the `k` best chunks."""
        depth = max(fusion.depth, k)
        b_rows = _top(bm25_all, depth, positive_only=True).tolist()
        d_rows = _top(sims, depth, positive_only=False).tolist()
        hits = [{str(r): float(bm25_all[r]) for r in b_rows},
                {str(r): float(sims[r]) for r in d_rows}]
        extra: list[float] = []
        named = self._named_sections(snap, query)
        if named:
            # A third list: sections whose own heading the query names ("what does
            # addParam do"), worth as much as a method's best hit. Long questions
            # otherwise drift to overview pages.
            hits.append({str(r): 1.0 for r in named})
            extra.append(1.0)
        # Every chunk has a BM25 score and a cosine: a method that missed a hit scores it.
        lookups = [lambda d: float(bm25_all[int(d)]), lambda d: float(sims[int(d)]),
                   lambda d: 0.0]
        fused = fuse(hits, fusion, extra, lookups[:len(hits)])[:k]
        rows = np.array([int(r) for r, _ in fused], dtype=np.int64)
        rrf_top1 = math.nan
        if fused:
            rrf_top1 = dict(rrf([list(h) for h in hits]))[fused[0][0]]
        return rows, [s for _, s in fused], rrf_top1

    def search(self, query: str, k: int, method: str = "hybrid",
               query_vector: npt.NDArray[np.float32] | None = None,
               fusion: FusionSettings | None = None) -> SearchResult:
        """The `k` best chunks by `method`; a hybrid fuses as `fusion` says (default:
        the index's settings)."""
        check_method(method)
        snap = self._snap
        n = len(snap.chunks)
        bm25_all, sims, qv = self._scores(snap, query, method, query_vector)
        rrf_top1 = math.nan
        if method == "bm25":
            rows = _top(bm25_all, k, positive_only=True)
            scores = bm25_all[rows].tolist()
        elif method == "dense":
            assert sims is not None
            rows = _top(sims, k, positive_only=False)
            scores = sims[rows].tolist()
        else:
            assert sims is not None
            rows, scores, rrf_top1 = self._hybrid(snap, query, k, bm25_all, sims,
                                                  fusion or self.settings)

        passages = []
        for r, s in zip(rows.tolist(), scores, strict=True):
            c = snap.chunks[r]
            passages.append(Passage(doc_id=c.doc_id, title=c.title, text=c.text,
                                    score=float(s), source=c.source))
        return SearchResult(
            passages=passages,
            method=method,
            chunk_ids=[snap.chunks[r].chunk_id for r in rows.tolist()],
            query_vector=None if qv is None else np.asarray(qv, dtype=np.float32),
            dense_top1=float(sims.max()) if sims is not None and n else math.nan,
            dense_scores=sims[rows].tolist() if sims is not None else [],
            bm25_top1=float(bm25_all.max()) if n else 0.0,
            bm25_scores=bm25_all[rows].tolist(),
            passage_vectors=np.array(snap.vectors[rows], dtype=np.float32),
            version=snap.version,
            rrf_top1=rrf_top1,
        )
