"""Convert the public intent datasets in /work/shared/data into the labelled-file
formats the classifier trains on (CSV `text,category` / JSONL `text`,`label`).

Files are written into a caller-given directory (a tmp dir): never into the repo.
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Sequence
from pathlib import Path

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
CLINC_FULL = SHARED_DATA / "clinc150" / "data_full.json"
HWU64 = SHARED_DATA / "hwu64"


def available() -> bool:
    return CLINC_FULL.exists() and (HWU64 / "train" / "seq.in").exists()


def write_rows(rows: Sequence[tuple[str, str]], path: Path) -> Path:
    """CSV (text,category) for .csv, JSONL (text,label) otherwise."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".csv":
        with open(path, "w", encoding="utf-8", newline="") as f:
            w = csv.writer(f)
            w.writerow(["text", "category"])
            w.writerows(rows)
    else:
        with open(path, "w", encoding="utf-8") as f:
            for text, label in rows:
                f.write(json.dumps({"text": text, "label": label}, ensure_ascii=False) + "\n")
    return path


def clinc150_rows(
    split: str,
    *,
    include_oos: bool = True,
    intents: int | None = None,
    per_intent: int | None = None,
    oos_max: int | None = None,
    seed: int = 0,
) -> list[tuple[str, str]]:
    """CLINC150 "full" rows of `split` (train/val/test) plus its oos_<split> lines.

    `intents`: keep a seeded random subset of that many in-scope intents (the same
    subset for every split with the same seed); `per_intent` / `oos_max` cap lines.
    """
    data = json.loads(CLINC_FULL.read_text())
    rows = [(t, lab) for t, lab in data[split]]
    names = sorted({lab for _, lab in rows})
    if intents is not None:
        keep = set(random.Random(seed).sample(names, intents))
        rows = [r for r in rows if r[1] in keep]
    if per_intent is not None:
        rng = random.Random(seed)
        by: dict[str, list[tuple[str, str]]] = {}
        for r in rows:
            by.setdefault(r[1], []).append(r)
        rows = [r for lab in sorted(by) for r in rng.sample(by[lab], min(per_intent, len(by[lab])))]
    if include_oos:
        oos = [(t, lab) for t, lab in data[f"oos_{split}"]]
        if oos_max is not None:
            oos = random.Random(seed).sample(oos, min(oos_max, len(oos)))
        rows += oos
    return rows


def hwu64_rows(split: str) -> list[tuple[str, str]]:
    """HWU64 rows of `split` (train/valid/test)."""
    d = HWU64 / split
    texts = (d / "seq.in").read_text(encoding="utf-8").splitlines()
    labels = (d / "label").read_text(encoding="utf-8").splitlines()
    assert len(texts) == len(labels), f"{d}: seq.in/label misaligned"
    return [(t.strip(), lab.strip()) for t, lab in zip(texts, labels, strict=True) if t.strip()]


def clinc150_files(
    out_dir: Path, *, fmt: str = "csv", test_split: str = "test", **kw: object
) -> tuple[Path, Path]:
    """(train, test) files for CLINC150: train = in-scope + oos_train."""
    ext = "csv" if fmt == "csv" else "jsonl"
    return (
        write_rows(clinc150_rows("train", **kw), out_dir / f"clinc150_train.{ext}"),  # type: ignore[arg-type]
        write_rows(clinc150_rows(test_split, **kw), out_dir / f"clinc150_{test_split}.{ext}"),  # type: ignore[arg-type]
    )


def hwu64_files(out_dir: Path, *, fmt: str = "csv") -> tuple[Path, Path]:
    ext = "csv" if fmt == "csv" else "jsonl"
    return (
        write_rows(hwu64_rows("train"), out_dir / f"hwu64_train.{ext}"),
        write_rows(hwu64_rows("test"), out_dir / f"hwu64_test.{ext}"),
    )


if __name__ == "__main__":  # python -m tests.helpers.intent_datasets /tmp/intents
    import sys

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/intent-datasets")
    for pair in (clinc150_files(out), hwu64_files(out)):
        print(*pair)
