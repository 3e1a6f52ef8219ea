"""Chunking for the index: documents into bounded, stably identified chunks.

Markdown is split by headings (the heading path becomes the chunk title) and then
bounded in size; plain text is split by paragraphs under the same bound; BEIR
corpus rows stay whole (one chunk each), as BEIR evaluation expects.

Token counts are approximated as words x 1.3: all-MiniLM-L6-v2's WordPiece yields
about 1.2-1.4 pieces per English word, and a tokenizer call per block would make
chunking as slow as a small part of embedding for no change in where cuts fall.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec

from services.retriever.indexing.documents import Document, Skipped, load_documents

TOKENS_PER_WORD = 1.3
TITLE_SEPARATOR = " > "

_HEADING_RE = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_FENCE_RE = re.compile(r"^\s*(```|~~~)")


class Chunk(msgspec.Struct, frozen=True):
    """Unit of retrieval. `chunk_id` is stable across re-ingests (source + heading path +
    ordinal), `content_hash` changes with the content: together they make ingest
    idempotent (same id + same hash = keep the stored vector)."""

    chunk_id: str
    doc_id: str
    title: str
    text: str
    source: str
    content_hash: str

    @property
    def indexed_text(self) -> str:
        """What is embedded and BM25-indexed: the title carries the section context."""
        return f"{self.title}\n{self.text}" if self.title else self.text


def _sha1(*parts: str) -> str:
    h = hashlib.sha1()
    for p in parts:
        h.update(p.encode("utf-8"))
        h.update(b"\x1f")
    return h.hexdigest()


def make_chunk_id(source: str, heading_path: str, ordinal: int) -> str:
    return _sha1(source, heading_path, str(ordinal))[:20]


def content_hash(title: str, text: str) -> str:
    return _sha1(title, text)[:20]


def approx_tokens(text: str) -> int:
    return int(len(text.split()) * TOKENS_PER_WORD + 0.999)


def _make_chunk(doc_id: str, source: str, title: str, path_key: str, ordinal: int,
                text: str) -> Chunk:
    return Chunk(
        chunk_id=make_chunk_id(source, path_key, ordinal),
        doc_id=doc_id,
        title=title,
        text=text,
        source=source,
        content_hash=content_hash(title, text),
    )


# ---------------------------------------------------------------------------- bounding


def _split_blocks(text: str) -> list[str]:
    """Paragraphs, keeping fenced code blocks whole (blank lines inside a fence don't split)."""
    blocks: list[str] = []
    cur: list[str] = []
    in_fence = False
    for line in text.splitlines():
        if _FENCE_RE.match(line):
            in_fence = not in_fence
            cur.append(line)
            continue
        if not in_fence and not line.strip():
            if cur:
                blocks.append("\n".join(cur).strip("\n"))
                cur = []
            continue
        cur.append(line)
    if cur:
        blocks.append("\n".join(cur).strip("\n"))
    return [b for b in blocks if b.strip()]


def _word_windows(text: str, max_words: int, overlap_words: int) -> list[str]:
    """Fixed word windows with overlap; line breaks inside a window are kept."""
    # Split keeping each word's trailing whitespace so code blocks keep their layout.
    words = re.findall(r"\S+\s*", text)
    if len(words) <= max_words:
        return [text]
    stride = max(1, max_words - overlap_words)
    out: list[str] = []
    start = 0
    while start < len(words):
        out.append("".join(words[start : start + max_words]).strip())
        if start + max_words >= len(words):
            break
        start += stride
    return out


def bound_blocks(
    blocks: list[str],
    max_tokens: int,
    overlap_tokens: int,
    count_tokens: Callable[[str], int] = approx_tokens,
) -> list[str]:
    """Pack blocks greedily into pieces of <= max_tokens.

    A block larger than the bound is cut into overlapping word windows. When a piece
    is closed because the next block does not fit, the next piece starts with the
    last ~overlap_tokens words of the previous one, so a sentence that straddles the
    cut is still retrievable with its context.
    """
    max_words = max(1, int(max_tokens / TOKENS_PER_WORD))
    overlap_words = min(int(overlap_tokens / TOKENS_PER_WORD), max_words // 2)
    pieces: list[str] = []
    cur: list[str] = []
    cur_tokens = 0

    def flush() -> None:
        nonlocal cur, cur_tokens
        if cur:
            pieces.append("\n\n".join(cur))
        cur, cur_tokens = [], 0

    for block in blocks:
        n = count_tokens(block)
        if n > max_tokens:
            flush()
            pieces.extend(_word_windows(block, max_words, overlap_words))
            continue
        if cur and cur_tokens + n > max_tokens:
            prev = "\n\n".join(cur)
            flush()
            tail = prev.split()[-overlap_words:] if overlap_words else []
            if tail and count_tokens(" ".join(tail)) + n <= max_tokens:
                cur, cur_tokens = [" ".join(tail)], count_tokens(" ".join(tail))
        cur.append(block)
        cur_tokens += n
    flush()
    return pieces


# ---------------------------------------------------------------------------- chunkers


def chunk_markdown(
    text: str,
    source: str,
    max_tokens: int = 128,
    overlap_tokens: int = 16,
    *,
    doc_id: str | None = None,
    count_tokens: Callable[[str], int] = approx_tokens,
) -> list[Chunk]:
    """Split Markdown by headings (title = heading path "H1 > H2"), then bound size.

    Headings inside fenced code blocks are code, not structure, and are ignored.
    """
    doc_id = doc_id if doc_id is not None else source
    sections: list[tuple[list[str], list[str]]] = []  # (heading path, body lines)
    path: list[tuple[int, str]] = []
    body: list[str] = []
    in_fence = False

    def close_section() -> None:
        sections.append(([h for _, h in path], body))

    for line in text.splitlines():
        if _FENCE_RE.match(line):
            in_fence = not in_fence
        m = None if in_fence else _HEADING_RE.match(line)
        if m:
            close_section()
            level = len(m.group(1))
            path = [(lv, h) for lv, h in path if lv < level] + [(level, m.group(2).strip())]
            body = []
        else:
            body.append(line)
    close_section()

    chunks: list[Chunk] = []
    # Ordinals continue across repeated heading paths (two "## Example" under one H1)
    # so chunk ids stay unique.
    next_ordinal: dict[str, int] = {}
    for heading_path, lines in sections:
        title = TITLE_SEPARATOR.join(heading_path)
        pieces = bound_blocks(_split_blocks("\n".join(lines)), max_tokens, overlap_tokens,
                              count_tokens)
        for piece in pieces:
            ordinal = next_ordinal.get(title, 0)
            next_ordinal[title] = ordinal + 1
            chunks.append(_make_chunk(doc_id, source, title, title, ordinal, piece))
    return chunks


def chunk_text(
    text: str,
    source: str,
    max_tokens: int = 128,
    overlap_tokens: int = 16,
    *,
    doc_id: str | None = None,
    title: str = "",
    count_tokens: Callable[[str], int] = approx_tokens,
) -> list[Chunk]:
    """Plain text: paragraphs packed under the same bound as Markdown."""
    doc_id = doc_id if doc_id is not None else source
    pieces = bound_blocks(_split_blocks(text), max_tokens, overlap_tokens, count_tokens)
    return [_make_chunk(doc_id, source, title, "", i, p) for i, p in enumerate(pieces)]


def chunk_beir(doc: Document) -> list[Chunk]:
    """BEIR documents stay whole: qrels judge documents, not passages."""
    if not (doc.title or doc.text).strip():
        return []
    return [_make_chunk(doc.doc_id, doc.source, doc.title, doc.doc_id, 0, doc.text)]


def chunk_document(doc: Document, max_tokens: int = 128, overlap_tokens: int = 16) -> list[Chunk]:
    if doc.kind == "beir":
        return chunk_beir(doc)
    if doc.kind == "markdown":
        return chunk_markdown(doc.text, doc.source, max_tokens, overlap_tokens, doc_id=doc.doc_id)
    return chunk_text(doc.text, doc.source, max_tokens, overlap_tokens, doc_id=doc.doc_id,
                      title=doc.title)


def iter_chunks(path: Path, max_tokens: int = 128, overlap_tokens: int = 16) -> Iterator[Chunk]:
    """Every chunk of every document under `path`, in `load_documents` order."""
    for doc in load_documents(path):
        yield from chunk_document(doc, max_tokens, overlap_tokens)


def collect_chunks(path: Path, max_tokens: int = 128, overlap_tokens: int = 16,
                   skipped: list[Skipped] | None = None) -> tuple[int, list[Chunk]]:
    """(documents read, their chunks) under `path`; a repeated chunk id (e.g. a BEIR
    file with a repeated _id) keeps its first chunk. `skipped`: where files that cannot
    be read are named (documents.load_documents)."""
    docs = 0
    chunks: dict[str, Chunk] = {}
    for doc in load_documents(Path(path), skipped):
        docs += 1
        for c in chunk_document(doc, max_tokens, overlap_tokens):
            chunks.setdefault(c.chunk_id, c)
    return docs, list(chunks.values())
