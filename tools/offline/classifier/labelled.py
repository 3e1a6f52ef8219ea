"""Labelled lines for the Layer 2 head: loaders, dedupe, stratified split.

Accepted inputs (one or more files, mixed formats allowed):

* JSONL: `{"text": ..., "label": ...}` (extra keys such as `lang` are ignored, and may
  be null), or `{"topic": ..., "type": ...}` lines as exported from classify_history;
  a label may be a string or an integer id;
* CSV with a header containing `text` and `category` (or `label`).

A malformed line raises `InputError` naming the file, the line number and the field.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from offline.classifier.inputs import InputError, read_lines


def _clean(text: Any) -> str:
    return " ".join(str(text).split())


_KEY_PAIRS = (("text", "label"), ("topic", "type"), ("text", "category"))


def load_jsonl(path: Path) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for n, raw in read_lines(path):
        try:
            obj = json.loads(raw)
        except ValueError:
            raise InputError(path, n, "(line)", "not valid JSON") from None
        if not isinstance(obj, dict):
            raise InputError(path, n, "(line)", "not a JSON object")
        keys = next((pair for pair in _KEY_PAIRS if pair[0] in obj and pair[1] in obj), None)
        if keys is None:
            raise InputError(path, n, "text/label", "need text/label or topic/type keys")
        text, label = obj[keys[0]], obj[keys[1]]
        if not isinstance(text, str):
            raise InputError(path, n, keys[0], f"expected a string, got {_kind(text)}")
        if not isinstance(label, str | int) or isinstance(label, bool):
            raise InputError(path, n, keys[1],
                             f"expected a string or an integer, got {_kind(label)}")
        text = _clean(text)
        if text and str(label).strip():
            rows.append((text, str(label).strip()))
    return rows


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def load_csv(path: Path) -> list[tuple[str, str]]:
    try:
        return _read_csv(path)
    except OSError as exc:
        raise InputError(path, 0, "", exc.strerror or str(exc)) from None
    except UnicodeDecodeError:
        raise InputError(path, 0, "", "not UTF-8 text") from None


def _read_csv(path: Path) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        fields = [c.strip().lower() for c in reader.fieldnames or []]
        if "text" not in fields or not ({"category", "label"} & set(fields)):
            raise InputError(path, 1, "(header)", "CSV header must have text and category "
                             "columns")
        names = dict(zip(fields, reader.fieldnames or [], strict=True))
        label_col = names.get("category") or names["label"]
        for rec in reader:
            text, label = _clean(rec.get(names["text"]) or ""), (rec.get(label_col) or "").strip()
            if text and label:
                rows.append((text, label))
    return rows


def load_labelled(paths: Path | str | Iterable[Path | str]) -> list[tuple[str, str]]:
    """(text, label) lines from JSONL/CSV files, in file order."""
    if isinstance(paths, str | Path):
        paths = [paths]
    rows: list[tuple[str, str]] = []
    for p in paths:
        p = Path(p)
        suffix = p.suffix.lower()
        if suffix in (".jsonl", ".ndjson", ".json"):
            rows.extend(load_jsonl(p))
        elif suffix in (".csv", ".tsv"):
            rows.extend(load_csv(p))
        else:
            raise InputError(p, 0, "", "unknown labelled-data format (want .jsonl or .csv)")
    return rows


def dedupe(rows: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """Drop exact duplicate lines; a text with conflicting labels keeps its majority."""
    by_text: dict[str, dict[str, int]] = {}
    order: list[str] = []
    for text, label in rows:
        key = text.casefold()
        if key not in by_text:
            by_text[key] = {}
            order.append(text)
        by_text[key][label] = by_text[key].get(label, 0) + 1
    out = []
    for text in order:
        votes = by_text[text.casefold()]
        out.append((text, max(sorted(votes), key=lambda lab: votes[lab])))
    return out


def stratified_split(
    rows: Sequence[tuple[str, str]], holdout: float, seed: int = 0
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Per-label split; every label with >= 2 lines keeps >= 1 line on each side."""
    rng = np.random.default_rng(seed)
    by_label: dict[str, list[int]] = {}
    for i, (_, label) in enumerate(rows):
        by_label.setdefault(label, []).append(i)
    train_idx: list[int] = []
    test_idx: list[int] = []
    for label in sorted(by_label):
        idx = list(rng.permutation(by_label[label]))
        k = round(len(idx) * holdout)
        k = min(max(k, 1), len(idx) - 1) if len(idx) >= 2 else 0
        test_idx.extend(idx[:k])
        train_idx.extend(idx[k:])
    return [rows[i] for i in sorted(train_idx)], [rows[i] for i in sorted(test_idx)]
