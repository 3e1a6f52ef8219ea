"""Source documents for the index: Markdown, plain text and BEIR corpus files, read
from a file or a directory tree."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import msgspec

MARKDOWN_SUFFIXES = (".md", ".markdown")
TEXT_SUFFIXES = (".txt",)
BEIR_SUFFIXES = (".jsonl",)


class Document(msgspec.Struct, frozen=True):
    """One source document. `kind` picks the chunker: markdown | text | beir."""

    doc_id: str
    title: str
    text: str
    source: str
    kind: str = "text"


def source_file(source: str) -> str:
    """The file a chunk's `source` came from (a BEIR row's source is `file#id`): the unit
    an ingest adds, updates or lists."""
    return source.partition("#")[0]


def _load_beir(path: Path, source_prefix: str) -> Iterator[Document]:
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            doc_id = str(row["_id"])
            yield Document(
                doc_id=doc_id,
                title=str(row.get("title") or ""),
                text=str(row.get("text") or ""),
                source=f"{source_prefix}#{doc_id}",
                kind="beir",
            )


def _load_file(path: Path, rel: str) -> Iterator[Document]:
    suffix = path.suffix.lower()
    if suffix in BEIR_SUFFIXES:
        yield from _load_beir(path, rel)
    elif suffix in MARKDOWN_SUFFIXES:
        yield Document(doc_id=rel, title=path.stem, text=path.read_text(encoding="utf-8"),
                       source=rel, kind="markdown")
    elif suffix in TEXT_SUFFIXES:
        yield Document(doc_id=rel, title=path.stem, text=path.read_text(encoding="utf-8"),
                       source=rel, kind="text")


def load_documents(path: Path) -> Iterator[Document]:
    """Yield documents from a file or a directory tree (.md, .txt, BEIR .jsonl).

    Document ids are paths relative to the given directory (or the file name), so the
    same tree ingested from another checkout gets the same ids. Files are visited in
    sorted order for deterministic chunk order.
    """
    path = Path(path)
    if path.is_file():
        yield from _load_file(path, path.name)
        return
    if not path.is_dir():
        raise FileNotFoundError(path)
    suffixes = MARKDOWN_SUFFIXES + TEXT_SUFFIXES + BEIR_SUFFIXES
    for p in sorted(path.rglob("*")):
        if p.is_file() and p.suffix.lower() in suffixes and not any(
            part.startswith(".") for part in p.relative_to(path).parts
        ):
            yield from _load_file(p, p.relative_to(path).as_posix())
