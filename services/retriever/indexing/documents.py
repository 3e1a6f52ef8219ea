"""Source documents for the index: Markdown, plain text and BEIR corpus files, read
from a file or a directory tree.

A file that cannot be read as text (binary bytes, not UTF-8, a BEIR line that is not
JSON) or of a kind not read here (an image) is skipped, named with its reason in the
list the caller passes (`skipped`); without one, an unreadable file raises as it did."""

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


READ_SUFFIXES = MARKDOWN_SUFFIXES + TEXT_SUFFIXES + BEIR_SUFFIXES
NOT_READ = f"not a kind of file ingest reads ({', '.join(READ_SUFFIXES)})"


class Skipped(msgspec.Struct, frozen=True):
    """A file an ingest left out, and why."""

    file: str
    reason: str


class UnreadableError(ValueError):
    """A file that is not text (its reason is the message)."""


def read_text(path: Path) -> str:
    """The file as UTF-8 text; UnreadableError for binary bytes or another encoding."""
    data = path.read_bytes()
    if b"\x00" in data:
        raise UnreadableError("binary, not text (it holds NUL bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableError(f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                              f"{exc.start})") from None


def source_file(source: str) -> str:
    """The file a chunk's `source` came from (a BEIR row's source is `file#id`): the unit
    an ingest adds, updates or lists."""
    return source.partition("#")[0]


def _load_beir(path: Path, source_prefix: str) -> Iterator[Document]:
    for number, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UnreadableError(f"line {number} is not JSON ({exc.msg})") from None
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
        yield Document(doc_id=rel, title=path.stem, text=read_text(path), source=rel,
                       kind="markdown")
    elif suffix in TEXT_SUFFIXES:
        yield Document(doc_id=rel, title=path.stem, text=read_text(path), source=rel,
                       kind="text")


def _loaded(path: Path, rel: str, skipped: list[Skipped] | None) -> list[Document]:
    """A file's documents, whole or none: a file that cannot be read is skipped (named
    in `skipped`) or, without that list, raises."""
    if skipped is None:
        return list(_load_file(path, rel))
    try:
        return list(_load_file(path, rel))
    except UnreadableError as exc:
        skipped.append(Skipped(rel, str(exc)))
    except OSError as exc:
        skipped.append(Skipped(rel, (exc.strerror or str(exc)).lower()))
    return []


def load_documents(path: Path, skipped: list[Skipped] | None = None) -> Iterator[Document]:
    """Yield documents from a file or a directory tree (.md, .txt, BEIR .jsonl).

    Document ids are paths relative to the given directory (or the file name), so the
    same tree ingested from another checkout gets the same ids. Files are visited in
    sorted order for deterministic chunk order. With a `skipped` list, files that
    cannot be read as text, and in a tree the files of other kinds, are named there
    with their reason instead (hidden files and folders are passed over unnamed).
    """
    path = Path(path)
    if path.is_file():
        if path.suffix.lower() not in READ_SUFFIXES and skipped is not None:
            skipped.append(Skipped(path.name, NOT_READ))
        yield from _loaded(path, path.name, skipped)
        return
    if not path.is_dir():
        raise FileNotFoundError(path)
    for p in sorted(path.rglob("*")):
        rel = p.relative_to(path)
        if not p.is_file() or any(part.startswith(".") for part in rel.parts):
            continue
        if p.suffix.lower() in READ_SUFFIXES:
            yield from _loaded(p, rel.as_posix(), skipped)
        elif skipped is not None:
            skipped.append(Skipped(rel.as_posix(), NOT_READ))
