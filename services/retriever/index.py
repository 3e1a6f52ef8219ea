"""Embedded, in-process hybrid index: bm25s (lexical) + dense vectors, fused with RRF.

On-disk layout (one directory per ingest, swapped atomically)::

    index_dir/
      CURRENT            -> text file naming the live version directory ("v000003")
      v000003/
        manifest.json    version, encoder, BM25 settings, counts, ingest report
        chunks.msgpack   list[Chunk] (row i of vectors.npy is chunk i)
        vectors.npy      float32 (n_chunks, dim), L2-normalised
        bm25/            bm25s index files

A writer builds a complete new version directory, then replaces CURRENT with
os.replace (atomic on POSIX), so a reader sees either the old or the new index, never
half of one. Old versions are kept for a while so a replica that read CURRENT just
before the swap can still open what it read.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import msgspec
import numpy as np
import numpy.typing as npt

from services.retriever.ingest import Chunk, chunk_document, load_documents
from shared.contracts.pipeline import Passage
from shared.embeddings import Encoder

log = logging.getLogger(__name__)

METHODS = ("bm25", "dense", "hybrid")
CURRENT_FILE = "CURRENT"
LOCK_FILE = ".ingest.lock"
FORMAT_VERSION = 1
KEEP_VERSIONS = 3

# Retrieval defaults (ADR-0003 hybrid retrieval): RRF constant 60 as in Cormack et al.
# 2009, 8 passages for the generator, 100 candidates per method before fusion.
RRF_K = 60
TOP_K = 8
CANDIDATE_DEPTH = 100


def _default_stemmer() -> str | None:
    # Snowball English stemming (PyStemmer) matches what standard BM25 baselines
    # (Anserini/Lucene EnglishAnalyzer, Porter) do; without it BM25 loses ~0.03 nDCG@10
    # on SciFact. The index records its choice, so queries are always tokenized alike.
    try:
        import Stemmer  # noqa: F401
    except ImportError:
        log.warning("PyStemmer not installed: BM25 without stemming (about -0.03 nDCG@10)")
        return None
    return "english"


class Bm25Config(msgspec.Struct, frozen=True):
    """bm25s settings. k1/b/method are the Lucene defaults; stopwords "en" is Lucene's
    33-word English list (bm25s.stopwords.STOPWORDS_EN)."""

    k1: float = 1.2
    b: float = 0.75
    method: str = "lucene"
    stopwords: str = "en"
    stemmer: str | None = msgspec.field(default_factory=_default_stemmer)


class RetrievalSettings(msgspec.Struct, frozen=True):
    rrf_k: int = RRF_K
    bm25_weight: float = 1.0
    dense_weight: float = 1.0
    top_k: int = TOP_K
    depth: int = CANDIDATE_DEPTH


class IngestReport(msgspec.Struct):
    docs: int
    chunks: int
    added: int  # chunk ids not in the previous version (embedded)
    updated: int  # same chunk id, new content (embedded)
    unchanged: int  # vector reused
    removed: int  # chunk ids gone (their documents disappeared or shrank)
    seconds: float
    chunks_per_s: float  # all chunks processed / wall time
    docs_per_s: float
    embedded: int = 0
    embed_seconds: float = 0.0
    embed_chunks_per_s: float = 0.0
    version: int = 0
    changed: bool = True  # False: nothing differed, no new version was written


@dataclass
class SearchResult:
    """Passages plus the signals the relevance check needs without re-embedding.

    `dense_scores[i]` / `bm25_scores[i]` belong to `passages[i]`; `dense_top1` is the
    cosine of the best dense hit over the whole index (NaN when no query vector was
    computed, e.g. method="bm25" without an encoder).
    """

    passages: list[Passage]
    method: str
    chunk_ids: list[str] = field(default_factory=list)
    query_vector: npt.NDArray[np.float32] | None = None
    dense_top1: float = math.nan
    dense_scores: list[float] = field(default_factory=list)
    bm25_top1: float = 0.0
    bm25_scores: list[float] = field(default_factory=list)
    passage_vectors: npt.NDArray[np.float32] | None = None
    version: int = 0


# ---------------------------------------------------------------------------- RRF


def rrf(
    rankings: list[list[str]], k: int = RRF_K, weights: list[float] | None = None
) -> list[tuple[str, float]]:
    """Reciprocal Rank Fusion: score(d) = sum_m w_m / (k + rank_m(d)), ranks from 1.

    A document absent from a ranking gets nothing from it; a repeated id within one
    ranking counts once, at its best rank. Ties are broken by the best single rank,
    then by id, so equal inputs always give the same order.
    """
    if weights is None:
        weights = [1.0] * len(rankings)
    if len(weights) != len(rankings):
        raise ValueError(f"{len(weights)} weights for {len(rankings)} rankings")
    scores: dict[str, float] = {}
    best: dict[str, int] = {}
    for w, ranking in zip(weights, rankings, strict=True):
        seen: set[str] = set()
        for rank, doc in enumerate(ranking, start=1):
            if doc in seen:
                continue
            seen.add(doc)
            scores[doc] = scores.get(doc, 0.0) + w / (k + rank)
            best[doc] = min(best.get(doc, rank), rank)
    return sorted(scores.items(), key=lambda kv: (-kv[1], best[kv[0]], kv[0]))


# ---------------------------------------------------------------------------- BM25 text


class Bm25Tokenizer:
    """Same rules as bm25s.tokenize (lowercase, `\\b\\w\\w+\\b`, stopwords, optional
    stemmer), callable per query without bm25s's per-call setup and progress bars."""

    def __init__(self, config: Bm25Config) -> None:
        from bm25s.stopwords import STOPWORDS_EN

        self._split = re.compile(r"(?u)\b\w\w+\b").findall
        self._stop = frozenset(STOPWORDS_EN) if config.stopwords == "en" else frozenset()
        self._stem = None
        self._cache: dict[str, str] = {}
        if config.stemmer:
            try:
                import Stemmer
            except ImportError as e:  # index built with stemming, reader without PyStemmer
                raise ImportError(
                    f"this index uses the {config.stemmer!r} stemmer: pip install PyStemmer"
                ) from e
            self._stem = Stemmer.Stemmer(config.stemmer).stemWord

    def __call__(self, text: str) -> list[str]:
        toks = [t for t in self._split(text.lower()) if t not in self._stop]
        if self._stem is None:
            return toks
        out = []
        for t in toks:
            s = self._cache.get(t)
            if s is None:
                s = self._stem(t)
                if len(self._cache) < 200_000:
                    self._cache[t] = s
            out.append(s)
        return out


_HEADING_WORD = re.compile(r"[a-z_][a-z0-9_]{2,}")
_QUERY_WORD = re.compile(r"[a-z_][a-z0-9_]{2,}")


def _build_bm25(chunks: Sequence[Chunk], config: Bm25Config) -> Any:
    import bm25s

    tok = Bm25Tokenizer(config)
    corpus_tokens = [tok(c.indexed_text) for c in chunks]
    retriever = bm25s.BM25(k1=config.k1, b=config.b, method=config.method)
    retriever.index(corpus_tokens, show_progress=False)
    return retriever


# ---------------------------------------------------------------------------- storage


def _version_name(version: int) -> str:
    return f"v{version:06d}"


def read_current(index_dir: Path) -> str | None:
    try:
        name = (Path(index_dir) / CURRENT_FILE).read_text().strip()
    except FileNotFoundError:
        return None
    return name or None


def _write_current(index_dir: Path, name: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=index_dir, prefix=".CURRENT.")
    with os.fdopen(fd, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, index_dir / CURRENT_FILE)


@contextlib.contextmanager
def _ingest_lock(index_dir: Path) -> Iterator[None]:
    """One writer at a time per index directory (readers never lock)."""
    with open(index_dir / LOCK_FILE, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _gc_versions(index_dir: Path, keep: int, current: str) -> None:
    versions = sorted(p for p in index_dir.glob("v[0-9]*") if p.is_dir())
    for p in versions[:-keep]:
        if p.name != current:
            shutil.rmtree(p, ignore_errors=True)
    for p in index_dir.glob(".tmp-*"):  # leftovers of a crashed writer
        shutil.rmtree(p, ignore_errors=True)


def encoder_name(encoder: Encoder) -> str:
    return str(getattr(encoder, "model_name", type(encoder).__qualname__))


@dataclass(frozen=True)
class _Snapshot:
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
    def load(cls, index_dir: Path, name: str) -> _Snapshot:
        import bm25s

        path = index_dir / name
        manifest = json.loads((path / "manifest.json").read_text())
        chunks = msgspec.msgpack.decode((path / "chunks.msgpack").read_bytes(), type=list[Chunk])
        vectors = np.load(path / "vectors.npy", mmap_mode="r")
        config = msgspec.convert(manifest["bm25"], Bm25Config)
        retriever = bm25s.BM25.load(str(path / "bm25"), mmap=True, show_progress=False)
        if len(chunks) != vectors.shape[0]:
            raise ValueError(f"{path}: {len(chunks)} chunks but {vectors.shape[0]} vectors")
        return cls(name, path, manifest, chunks, vectors, retriever, Bm25Tokenizer(config))


def _load_current(index_dir: Path, attempts: int = 5) -> _Snapshot:
    last: Exception | None = None
    for _ in range(attempts):
        name = read_current(index_dir)
        if name is None:
            raise FileNotFoundError(f"no index at {index_dir} (missing {CURRENT_FILE})")
        try:
            return _Snapshot.load(index_dir, name)
        except FileNotFoundError as e:  # swapped and collected between read and open
            last = e
            time.sleep(0.05)
    raise RuntimeError(f"could not open a stable version of {index_dir}") from last


# ---------------------------------------------------------------------------- ingest


def ingest(
    path: Path,
    index_dir: Path,
    encoder: Encoder,
    *,
    progress: bool = True,
    batch_size: int = 64,
    max_tokens: int = 128,
    overlap_tokens: int = 16,
    bm25: Bm25Config | None = None,
    sort_by_length: bool = True,
    keep_versions: int = KEEP_VERSIONS,
) -> IngestReport:
    """Load, chunk, embed what changed, and publish a new index version atomically.

    Idempotent: a chunk whose id and content hash match the live version keeps its
    stored vector; chunks not produced any more are dropped. When nothing changed no
    version is written (replicas are not made to reload for nothing).
    """
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    index_dir = Path(index_dir)
    index_dir.mkdir(parents=True, exist_ok=True)
    bm25 = bm25 or Bm25Config()

    docs = 0
    chunks: list[Chunk] = []
    seen_ids: set[str] = set()
    for doc in load_documents(Path(path)):
        docs += 1
        for c in chunk_document(doc, max_tokens, overlap_tokens):
            if c.chunk_id in seen_ids:  # e.g. a BEIR file with a repeated _id: keep the first
                continue
            seen_ids.add(c.chunk_id)
            chunks.append(c)

    if not chunks:
        raise ValueError(f"no documents to index under {path} (.md, .txt, BEIR .jsonl)")

    with _ingest_lock(index_dir):
        prev: _Snapshot | None = None
        if read_current(index_dir) is not None:
            prev = _load_current(index_dir)
        dim = int(encoder.dim)
        enc_id: dict[str, Any] = {"name": encoder_name(encoder), "dim": dim}
        same_encoder = prev is not None and prev.manifest.get("encoder") == enc_id
        prev_rows: dict[str, tuple[str, int]] = {}
        if prev is not None:
            prev_rows = {c.chunk_id: (c.content_hash, i) for i, c in enumerate(prev.chunks)}

        vectors = np.zeros((len(chunks), dim), dtype=np.float32)
        to_embed: list[int] = []
        added = updated = unchanged = 0
        for i, c in enumerate(chunks):
            old = prev_rows.get(c.chunk_id)
            if old is not None and old[0] == c.content_hash and same_encoder:
                assert prev is not None
                vectors[i] = prev.vectors[old[1]]
                unchanged += 1
            else:
                to_embed.append(i)
                if old is None:
                    added += 1
                else:
                    updated += 1
        removed = len(set(prev_rows) - seen_ids)

        same_bm25 = prev is not None and prev.manifest.get("bm25") == msgspec.to_builtins(bm25)
        same_order = prev is not None and [c.chunk_id for c in prev.chunks] == [
            c.chunk_id for c in chunks
        ]
        if not to_embed and not removed and same_bm25 and same_order:
            assert prev is not None
            secs = time.perf_counter() - t0
            return IngestReport(
                docs=docs, chunks=len(chunks), added=0, updated=0, unchanged=unchanged,
                removed=0, seconds=secs, chunks_per_s=len(chunks) / secs,
                docs_per_s=docs / secs, version=prev.version, changed=False,
            )

        t_embed = time.perf_counter()
        if to_embed:
            # Length-sorted batches pad less: MiniLM cost grows with the longest text in
            # a batch, so mixing a 20-token and a 250-token text wastes most of a row.
            order = sorted(to_embed, key=lambda i: len(chunks[i].indexed_text)) \
                if sort_by_length else list(to_embed)
            bar = tqdm(total=len(order), desc="embedding", unit="chunk", disable=not progress)
            for s in range(0, len(order), batch_size):
                rows = order[s : s + batch_size]
                vecs = encoder.encode([chunks[i].indexed_text for i in rows], batch_size=batch_size)
                vectors[rows] = vecs
                bar.update(len(rows))
            bar.close()
        embed_secs = time.perf_counter() - t_embed

        retriever = _build_bm25(chunks, bm25)
        version = (prev.version if prev else 0) + 1
        name = _version_name(version)
        tmp = Path(tempfile.mkdtemp(dir=index_dir, prefix=".tmp-"))
        np.save(tmp / "vectors.npy", vectors)
        (tmp / "chunks.msgpack").write_bytes(msgspec.msgpack.encode(chunks))
        retriever.save(str(tmp / "bm25"), show_progress=False)

        secs = time.perf_counter() - t0
        report = IngestReport(
            docs=docs, chunks=len(chunks), added=added, updated=updated, unchanged=unchanged,
            removed=removed, seconds=secs, chunks_per_s=len(chunks) / secs if secs else 0.0,
            docs_per_s=docs / secs if secs else 0.0, embedded=len(to_embed),
            embed_seconds=embed_secs,
            embed_chunks_per_s=len(to_embed) / embed_secs if to_embed and embed_secs else 0.0,
            version=version, changed=True,
        )
        full_embed = msgspec.to_builtins(report) if len(to_embed) == len(chunks) else (
            prev.manifest.get("full_embed") if prev else None
        )
        manifest = {
            "format": FORMAT_VERSION,
            "version": version,
            "created_at": time.time(),
            "source": str(path),
            "encoder": enc_id,
            "bm25": msgspec.to_builtins(bm25),
            "chunking": {"max_tokens": max_tokens, "overlap_tokens": overlap_tokens},
            "counts": {"docs": docs, "chunks": len(chunks)},
            "last_ingest": msgspec.to_builtins(report),
            # Stats of the latest ingest that embedded every chunk (benchmarks read it
            # when the current run reused cached vectors).
            "full_embed": full_embed,
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        os.replace(tmp, index_dir / name)
        _write_current(index_dir, name)
        _gc_versions(index_dir, keep_versions, name)
        return report


# ---------------------------------------------------------------------------- search


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
    return cand[order][:depth]


class EmbeddedIndex:
    """Read-only view of the live version in `index_dir`; `maybe_reload` follows ingests."""

    def __init__(self, index_dir: Path, encoder: Encoder | None, snapshot: _Snapshot,
                 settings: RetrievalSettings) -> None:
        self.index_dir = Path(index_dir)
        self.encoder = encoder
        self.settings = settings
        self._snap = snapshot
        self._headings: dict[str, dict[str, list[int]]] = {}
        self._check_encoder(snapshot)

    @classmethod
    def open(cls, index_dir: Path, encoder: Encoder | None,
             settings: RetrievalSettings | None = None) -> EmbeddedIndex:
        return cls(index_dir, encoder, _load_current(Path(index_dir)),
                   settings or RetrievalSettings())

    def _check_encoder(self, snap: _Snapshot) -> None:
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

    def _named_sections(self, snap: _Snapshot, query: str) -> list[int]:
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

    def maybe_reload(self) -> bool:
        """Reload if CURRENT names another version. Costs one tiny file read; a failed
        reload keeps serving the old version."""
        name = read_current(self.index_dir)
        if name is None or name == self._snap.name:
            return False
        try:
            snap = _load_current(self.index_dir)
            self._check_encoder(snap)
        except Exception:
            log.exception("reload of %s failed; keeping %s", self.index_dir, self._snap.name)
            return False
        self._snap = snap  # one reference swap: in-flight searches keep the old snapshot
        return True

    # -- query ---------------------------------------------------------------

    def encode_query(self, query: str) -> npt.NDArray[np.float32]:
        if self.encoder is None:
            raise RuntimeError(
                "dense/hybrid search needs an encoder: open the index with one, or pass "
                "query_vector (method='bm25' works without)"
            )
        return np.asarray(self.encoder.encode([query], batch_size=1)[0], dtype=np.float32)

    def search(
        self,
        query: str,
        k: int = TOP_K,
        method: str = "hybrid",
        query_vector: npt.NDArray[np.float32] | None = None,
        *,
        depth: int | None = None,
        weights: tuple[float, float] | None = None,
    ) -> SearchResult:
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        snap = self._snap
        st = self.settings
        depth = max(depth or st.depth, k)
        n = len(snap.chunks)

        qv = query_vector
        if qv is None and method != "bm25":  # bm25 alone doesn't pay for an embedding
            qv = self.encode_query(query)
        sims = None
        if qv is not None and n:
            sims = np.asarray(snap.vectors @ np.asarray(qv, dtype=np.float32), dtype=np.float32)

        bm25_all = np.zeros(n, dtype=np.float32)
        if method != "dense" and n:
            toks = snap.tokenizer(query)
            ids = snap.bm25.get_tokens_ids(toks)
            if ids:
                bm25_all = np.asarray(snap.bm25.get_scores_from_ids(ids), dtype=np.float32)

        if method == "bm25":
            rows = _top(bm25_all, k, positive_only=True)
            scores = bm25_all[rows].tolist()
        elif method == "dense":
            assert sims is not None
            rows = _top(sims, k, positive_only=False)
            scores = sims[rows].tolist()
        else:
            assert sims is not None
            b_rows = _top(bm25_all, depth, positive_only=True)
            d_rows = _top(sims, depth, positive_only=False)
            w = list(weights or (st.bm25_weight, st.dense_weight))
            rankings = [[str(r) for r in b_rows], [str(r) for r in d_rows]]
            named = self._named_sections(snap, query)
            if named:
                # A third ranking: sections whose own heading the query names ("what
                # does addParam do"). Long questions otherwise drift to overview pages.
                rankings.append([str(r) for r in named])
                w.append(1.0)
            fused = rrf(rankings, k=st.rrf_k, weights=w)[:k]
            rows = np.array([int(r) for r, _ in fused], dtype=np.int64)
            scores = [s for _, s in fused]

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
        )


# ---------------------------------------------------------------------------- async API


@runtime_checkable
class RetrievalBackend(Protocol):
    """What the retriever worker talks to; embedded and Elasticsearch implement it."""

    async def search(self, query: str, k: int = TOP_K, method: str = "hybrid") -> SearchResult:
        ...

    async def maybe_reload(self) -> bool: ...

    async def close(self) -> None: ...


class EmbeddedBackend:
    """Async facade over EmbeddedIndex.

    A query that embeds costs ~5-15 ms of CPU, long enough to stall NATS heartbeats
    and acks under load, so by default it runs in a worker thread. BM25 alone (or a
    query that brings its vector) takes well under a millisecond, less than the
    thread hand-off itself, and runs on the loop.
    """

    def __init__(self, index: EmbeddedIndex, *, offload: bool = True) -> None:
        self.index = index
        self.offload = offload

    @classmethod
    def open(cls, index_dir: Path, encoder: Encoder | None,
             settings: RetrievalSettings | None = None, *, offload: bool = True
             ) -> EmbeddedBackend:
        return cls(EmbeddedIndex.open(index_dir, encoder, settings), offload=offload)

    async def search(self, query: str, k: int = TOP_K, method: str = "hybrid",
                     query_vector: npt.NDArray[np.float32] | None = None) -> SearchResult:
        embeds = method != "bm25" and query_vector is None
        if self.offload and embeds:
            return await asyncio.to_thread(self.index.search, query, k, method, query_vector)
        return self.index.search(query, k, method, query_vector)

    async def maybe_reload(self) -> bool:
        if read_current(self.index.index_dir) == self.index._snap.name:
            return False  # the common case stays on the loop: one small read
        return await asyncio.to_thread(self.index.maybe_reload)

    async def close(self) -> None:
        return None

    @property
    def version(self) -> int:
        return self.index.version
