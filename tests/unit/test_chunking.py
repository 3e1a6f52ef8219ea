"""Markdown / text / BEIR chunking and document loading."""

import itertools
import json
from pathlib import Path

from services.retriever.indexing.chunking import (
    approx_tokens,
    chunk_beir,
    chunk_document,
    chunk_markdown,
    chunk_text,
)
from services.retriever.indexing.documents import Document, load_documents

MD = """# Loops

AVAP has a single loop form.

## startLoop

Signature: `startLoop(varName, from, to)`.

```
# not a heading: a comment inside code
startLoop(i, 1, 3)
endLoop()
```

## endLoop

Closes the loop body.

### Example

## endLoop

A second section with the same heading path.
"""


def _words(n: int, prefix: str = "w") -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


def test_headings_become_title_paths() -> None:
    chunks = chunk_markdown(MD, "loops.md")
    titles = [c.title for c in chunks]
    assert titles == ["Loops", "Loops > startLoop", "Loops > endLoop", "Loops > endLoop"]
    start = chunks[1]
    assert "# not a heading" in start.text  # code fence kept, its '#' line is code
    assert "startLoop(i, 1, 3)" in start.text
    assert all(c.doc_id == "loops.md" and c.source == "loops.md" for c in chunks)
    # Empty "### Example" section yields no chunk; repeated paths still get unique ids.
    assert len({c.chunk_id for c in chunks}) == len(chunks)


def test_size_bound_and_overlap() -> None:
    text = "# Big\n\n" + _words(400)
    chunks = chunk_markdown(text, "big.md", max_tokens=128, overlap_tokens=16)
    assert len(chunks) > 3
    assert all(approx_tokens(c.text) <= 128 for c in chunks)
    for a, b in itertools.pairwise(chunks):
        tail = a.text.split()[-12:]  # 16 tokens / 1.3 = 12 words of overlap
        assert b.text.split()[:12] == tail
    # Every word survives chunking.
    seen = {w for c in chunks for w in c.text.split()}
    assert seen == set(_words(400).split())


def test_paragraph_packing_carries_overlap() -> None:
    paras = [_words(40, p) for p in "abcdef"]  # 52 tokens each
    chunks = chunk_text("\n\n".join(paras), "notes.txt", max_tokens=128, overlap_tokens=16)
    assert len(chunks) >= 3
    assert all(approx_tokens(c.text) <= 128 for c in chunks)
    assert chunks[0].text.startswith("a0")
    assert "b39" in chunks[0].text
    # The second chunk starts with the last words of the first one.
    assert chunks[1].text.split()[:12] == chunks[0].text.split()[-12:]


def test_ids_stable_and_hashes_track_content() -> None:
    a = chunk_markdown(MD, "loops.md")
    b = chunk_markdown(MD, "loops.md")
    assert [c.chunk_id for c in a] == [c.chunk_id for c in b]
    assert [c.content_hash for c in a] == [c.content_hash for c in b]
    edited = chunk_markdown(MD.replace("Closes the loop body.", "Ends the loop."), "loops.md")
    assert [c.chunk_id for c in edited] == [c.chunk_id for c in a]
    changed = [x.title for x, y in zip(a, edited, strict=True) if x.content_hash != y.content_hash]
    assert changed == ["Loops > endLoop"]
    other = chunk_markdown(MD, "other.md")
    assert not {c.chunk_id for c in other} & {c.chunk_id for c in a}


def test_plain_text_and_beir() -> None:
    chunks = chunk_text("First para.\n\nSecond para.", "a.txt", title="a")
    assert len(chunks) == 1
    assert chunks[0].text == "First para.\n\nSecond para."
    doc = Document(doc_id="42", title="T", text=_words(300), source="c.jsonl#42", kind="beir")
    (c,) = chunk_beir(doc)  # whole, however long
    assert c.doc_id == "42"
    assert c.title == "T"
    assert len(c.text.split()) == 300
    assert c.indexed_text.startswith("T\n")
    assert chunk_document(doc) == [c]


def test_load_documents(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.md").write_text("# A\n\ntext a\n")
    (tmp_path / "sub" / "b.txt").write_text("text b\n")
    (tmp_path / "ignored.py").write_text("x = 1\n")
    (tmp_path / "corpus.jsonl").write_text(
        json.dumps({"_id": "d1", "title": "t1", "text": "x1"}) + "\n"
        + json.dumps({"_id": "d2", "title": "", "text": "x2"}) + "\n"
    )
    docs = list(load_documents(tmp_path))
    assert [(d.doc_id, d.kind) for d in docs] == [
        ("a.md", "markdown"), ("d1", "beir"), ("d2", "beir"), ("sub/b.txt", "text"),
    ]
    assert [d.doc_id for d in load_documents(tmp_path / "corpus.jsonl")] == ["d1", "d2"]
    assert [d.doc_id for d in load_documents(tmp_path / "a.md")] == ["a.md"]
