"""Embedded index end to end with the real MiniLM encoder (loaded once per session)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from services.retriever.embedded import EmbeddedRetrieval
from services.retriever.fusion import Fusion, FusionSettings
from services.retriever.index import EmbeddedIndex, read_current
from services.retriever.indexing.embedded_ingest import ingest, list_sources
from services.retriever.ports import Retrieval
from shared.encoders.embeddings import Vectors

DOCS = {
    "loops.md": """# Loops

## startLoop

`startLoop(varName, from, to)` repeats the body once for every value of a counter,
from the first value to the last value, counting upward by one.

## endLoop

`endLoop()` closes the body of a loop. Every startLoop needs exactly one endLoop.
""",
    "http.md": """# HTTP calls

## RequestGet

`RequestGet(url, headers, params, target)` sends an HTTP GET request to an external web
service and stores the response body in the target variable.
""",
    "crypto.md": """# Hashing

## encodeSHA256

`encodeSHA256(source, target)` computes the SHA-256 digest of a value, for example to
store a password hash instead of the password itself.
""",
    "database.md": """# Database

## ormDirect

`ormDirect(sql, target)` runs an SQL statement against the configured database and
stores the resulting rows as a list.
""",
}


class CountingEncoder:
    """Wraps the real encoder and records what was embedded."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.model_name = getattr(inner, "model_name", "x")
        self.texts: list[str] = []

    @property
    def dim(self) -> int:
        return self.inner.dim  # type: ignore[attr-defined, no-any-return]

    def encode(self, texts: list[str], batch_size: int = 32) -> Vectors:
        self.texts.extend(texts)
        return self.inner.encode(texts, batch_size=batch_size)  # type: ignore[attr-defined, no-any-return]


@pytest.fixture(scope="session")
def minilm() -> object:
    from shared.encoders.embeddings import SentenceTransformerEncoder, pin_threads

    pin_threads(1)
    return SentenceTransformerEncoder()


@pytest.fixture
def kb(tmp_path: Path) -> Path:
    root = tmp_path / "kb"
    root.mkdir()
    for name, text in DOCS.items():
        (root / name).write_text(text)
    return root


def _top_title(index: EmbeddedIndex, query: str, method: str) -> str:
    return index.search(query, k=3, method=method).passages[0].title


def test_ingest_search_and_incremental_updates(minilm: object, kb: Path, tmp_path: Path) -> None:
    enc = CountingEncoder(minilm)
    index_dir = tmp_path / "index"
    r1 = ingest(kb, index_dir, enc, progress=False)
    assert (r1.docs, r1.chunks, r1.added, r1.unchanged, r1.removed) == (4, 5, 5, 0, 0)
    assert r1.version == 1
    assert read_current(index_dir) == "v000001"

    index = EmbeddedIndex.open(index_dir, enc)
    assert len(index) == 5
    assert index.version == 1
    assert _top_title(index, "encodeSHA256 digest", "bm25") == "Hashing > encodeSHA256"
    assert _top_title(index, "how can I call a remote API over the web?", "dense") == \
        "HTTP calls > RequestGet"
    assert _top_title(index, "repeat something for each number in a range", "hybrid") == \
        "Loops > startLoop"
    res = index.search("run a SQL query on the database", k=2, method="hybrid")
    assert res.passages[0].doc_id == "database.md"
    assert res.query_vector is not None
    assert res.passage_vectors is not None
    assert len(res.dense_scores) == len(res.passages) == len(res.chunk_ids) == 2
    assert res.dense_top1 == pytest.approx(max(res.dense_scores), abs=1e-5)
    # First in both rankings: each method's best score over itself, weights 1 and 1.
    assert res.passages[0].score == pytest.approx(2.0)
    assert res.rrf_top1 == pytest.approx(2 / 61)
    plain = index.search("run a SQL query on the database", k=2, method="hybrid",
                         fusion=FusionSettings(method=Fusion.RRF))
    assert plain.passages[0].score == pytest.approx(2 / 61)

    vectors_before = np.array(np.load(index_dir / "v000001" / "vectors.npy"))
    other_replica = EmbeddedIndex.open(index_dir, enc)

    # Unchanged corpus: nothing embedded, no new version.
    enc.texts.clear()
    r2 = ingest(kb, index_dir, enc, progress=False)
    assert (r2.added, r2.updated, r2.removed, r2.unchanged, r2.changed) == (0, 0, 0, 5, False)
    assert enc.texts == []
    assert read_current(index_dir) == "v000001"
    assert not other_replica.maybe_reload()

    # Edit one file: only its changed chunk is re-embedded; the others keep their vectors.
    (kb / "http.md").write_text(DOCS["http.md"].replace("GET request", "GET call"))
    r3 = ingest(kb, index_dir, enc, progress=False)
    assert (r3.added, r3.updated, r3.unchanged, r3.removed, r3.version) == (0, 1, 4, 0, 2)
    assert len(enc.texts) == 1
    assert "GET call" in enc.texts[0]
    vectors_after = np.load(index_dir / "v000002" / "vectors.npy")
    chunks = EmbeddedIndex.open(index_dir, None).chunks
    for i, c in enumerate(chunks):
        if c.doc_id != "http.md":
            assert np.array_equal(vectors_after[i], vectors_before[i])

    # The replica opened before the re-ingest follows the swap without a restart.
    assert other_replica.version == 1
    assert other_replica.maybe_reload()
    assert other_replica.version == 2
    assert "GET call" in other_replica.search("RequestGet", k=1, method="bm25").passages[0].text

    # Delete a file and replace: its chunks go, nothing is embedded.
    enc.texts.clear()
    (kb / "loops.md").unlink()
    r4 = ingest(kb, index_dir, enc, replace=True, progress=False)
    assert (r4.docs, r4.chunks, r4.removed, r4.added, r4.updated) == (3, 3, 2, 0, 0)
    assert enc.texts == []
    assert other_replica.maybe_reload()
    assert len(other_replica) == 3
    assert all(c.doc_id != "loops.md" for c in other_replica.chunks)
    hits = other_replica.search("startLoop endLoop", k=3, method="hybrid").passages
    assert all(p.doc_id != "loops.md" for p in hits)
    # Old versions are garbage-collected down to the last few.
    assert sorted(p.name for p in index_dir.glob("v*")) == ["v000001", "v000002", "v000003"]


def test_bm25_only_without_encoder(minilm: object, kb: Path, tmp_path: Path) -> None:
    index_dir = tmp_path / "index"
    ingest(kb, index_dir, minilm, progress=False)  # type: ignore[arg-type]
    index = EmbeddedIndex.open(index_dir, None)
    res = index.search("ormDirect SQL", k=2, method="bm25")
    assert res.passages[0].doc_id == "database.md"
    assert res.query_vector is None
    assert np.isnan(res.dense_top1)
    with pytest.raises(RuntimeError, match="encoder"):
        index.search("ormDirect SQL", 8, method="hybrid")
    # With a precomputed query vector dense works without an encoder.
    qv = minilm.encode(["ormDirect SQL"])[0]  # type: ignore[attr-defined]
    assert index.search("", k=1, method="dense", query_vector=qv).passages[0].doc_id == \
        "database.md"
    with pytest.raises(ValueError, match="method must be one of"):
        index.search("x", 8, method="sparse")


async def test_async_backend(minilm: object, kb: Path, tmp_path: Path) -> None:
    index_dir = tmp_path / "index"
    ingest(kb, index_dir, minilm, progress=False)  # type: ignore[arg-type]
    backend = EmbeddedRetrieval(index_dir, method="hybrid", encoder=minilm,  # type: ignore[arg-type]
                                reload_every=0)
    assert isinstance(backend, Retrieval)
    res = await backend.search("hash a password", k=2)
    assert res.passages[0].doc_id == "crypto.md"
    assert not await backend.maybe_reload()
    (kb / "crypto.md").write_text(DOCS["crypto.md"] + "\nIt returns a hex string.\n")
    ingest(kb, index_dir, minilm, progress=False)  # type: ignore[arg-type]
    assert await backend.maybe_reload()
    assert (await backend.search("hash a password", k=2)).version == 2
    await backend.close()


async def test_waits_for_a_first_ingest_and_checks_for_a_new_one_once_per_interval(
        minilm: object, kb: Path, tmp_path: Path) -> None:
    index_dir = tmp_path / "index"
    backend = EmbeddedRetrieval(index_dir, method="bm25", encoder=None, reload_every=3600)
    empty = await backend.search("ormDirect SQL", k=2)
    assert empty.passages == []
    assert empty.method == "bm25"
    ingest(kb, index_dir, minilm, progress=False)  # type: ignore[arg-type]
    assert not await backend.maybe_reload()  # opens the first version: nothing to reload
    assert (await backend.search("ormDirect SQL", k=2)).passages[0].doc_id == "database.md"
    (kb / "database.md").unlink()
    ingest(kb, index_dir, minilm, replace=True, progress=False)  # type: ignore[arg-type]
    assert read_current(index_dir) == "v000002"
    assert not await backend.maybe_reload()  # checked less than an interval ago
    assert (await backend.search("ormDirect SQL", k=2)).version == 1


def test_missing_index_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no index"):
        EmbeddedIndex.open(tmp_path / "nothing", None)


def test_ingest_adds_updates_by_source_and_replaces_only_when_asked(
        minilm: object, kb: Path, tmp_path: Path) -> None:
    enc = CountingEncoder(minilm)
    index_dir = tmp_path / "index"
    ingest(kb, index_dir, enc, progress=False)
    mine = tmp_path / "mydocs"
    mine.mkdir()
    (mine / "notes.md").write_text("# Notes\n\n## Deploy\n\nDeploy with `make ship` on Fridays.\n")

    # Another folder adds: the first folder's documents stay, only the new one is embedded.
    enc.texts.clear()
    r = ingest(mine, index_dir, enc, progress=False)
    assert (r.docs, r.added, r.updated, r.unchanged, r.removed) == (1, 1, 0, 0, 0)
    assert len(enc.texts) == 1
    index = EmbeddedIndex.open(index_dir, enc)
    assert len(index) == 6
    assert _top_title(index, "encodeSHA256 digest", "bm25") == "Hashing > encodeSHA256"
    assert _top_title(index, "make ship deploy", "bm25") == "Notes > Deploy"
    listed = list_sources(index_dir)
    assert sorted(listed) == sorted([*DOCS, "notes.md"])
    assert listed["loops.md"]["chunks"] == 2
    assert listed["notes.md"]["from"] == str(mine.resolve())
    first_time = listed["http.md"]["ingested_at"]

    # Both folders again: idempotent, nothing embedded, no new version, times kept.
    enc.texts.clear()
    for folder in (kb, mine):
        again = ingest(folder, index_dir, enc, progress=False)
        assert (again.added, again.updated, again.removed, again.changed) == (0, 0, 0, False)
    assert enc.texts == []
    assert read_current(index_dir) == "v000002"

    # A file edited, shrunk and re-read alone: its chunks are replaced, the others stay.
    (kb / "loops.md").write_text("# Loops\n\n## startLoop\n\n`startLoop` counts upward.\n")
    (kb / "http.md").unlink()
    r = ingest(kb / "loops.md", index_dir, enc, progress=False)
    assert (r.added, r.updated, r.unchanged, r.removed, r.dropped) == (0, 1, 0, 0, 1)
    listed = list_sources(index_dir)
    assert listed["loops.md"]["chunks"] == 1
    assert listed["loops.md"]["ingested_at"] > first_time
    assert listed["http.md"]["ingested_at"] == first_time  # gone from the folder, kept
    assert listed["http.md"]["chunks"] == 1

    # --replace: the index becomes the folder read, nothing else.
    enc.texts.clear()
    r = ingest(mine, index_dir, enc, replace=True, progress=False)
    assert (r.added, r.updated, r.unchanged, r.removed) == (0, 0, 1, 4)
    assert enc.texts == []
    assert list(list_sources(index_dir)) == ["notes.md"]
    assert len(EmbeddedIndex.open(index_dir, enc)) == 1


def test_ingest_list_and_bad_usage_on_the_command_line(minilm: object, kb: Path,
                                                       tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from intentroute.cli import app

    index_dir = tmp_path / "index"
    runner = CliRunner()
    empty = runner.invoke(app, ["ingest", "--list", "--index-dir", str(index_dir)],
                          env={"ES_URL": ""})
    assert empty.exit_code == 0
    assert "nothing indexed" in empty.stderr
    ingest(kb, index_dir, minilm, progress=False)  # type: ignore[arg-type]
    listed = runner.invoke(app, ["ingest", "--list", "--index-dir", str(index_dir)],
                           env={"ES_URL": ""})
    assert listed.exit_code == 0
    rows = {line.split()[0]: line.split()[1] for line in listed.stdout.splitlines()}
    assert rows == {"crypto.md": "1", "database.md": "1", "http.md": "1", "loops.md": "2"}
    as_json = runner.invoke(app, ["ingest", "--list", "--json", "--index-dir", str(index_dir)],
                            env={"ES_URL": ""})
    assert json.loads(as_json.stdout)["sources"]["loops.md"]["chunks"] == 2

    no_path = runner.invoke(app, ["ingest", "--index-dir", str(index_dir)])
    assert (no_path.exit_code, no_path.stderr.strip()) == (
        2, "ingest needs PATH (a file or folder to add), or --list")
    missing = runner.invoke(app, ["ingest", str(tmp_path / "nope"), "--index-dir",
                                  str(index_dir)])
    assert missing.exit_code == 2
    assert missing.stderr.strip() == f"no such file or folder: {tmp_path / 'nope'}"
