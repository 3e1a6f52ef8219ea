"""BEIR queries and relevance judgements (the corpus is read by `indexing.documents`)."""

from __future__ import annotations

import json
from pathlib import Path


def load_qrels(path: Path) -> dict[str, dict[str, int]]:
    """BEIR qrels TSV with a header line: query-id, corpus-id, score."""
    out: dict[str, dict[str, int]] = {}
    with Path(path).open(encoding="utf-8") as f:
        header = f.readline()
        if not header.lower().startswith("query"):
            raise ValueError(f"{path}: expected a 'query-id corpus-id score' header")
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 3:
                continue
            out.setdefault(parts[0], {})[parts[1]] = int(parts[2])
    return out


def load_queries(path: Path, only: set[str] | None = None) -> dict[str, str]:
    """Query id -> text from queries.jsonl, restricted to `only` when given."""
    out: dict[str, str] = {}
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                qid = str(row["_id"])
                if only is None or qid in only:
                    out[qid] = row["text"]
    return out
