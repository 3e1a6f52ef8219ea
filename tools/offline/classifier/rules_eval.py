"""`intentroute eval rules`: each Layer 1 rule family's precision and coverage.

Input: a paraphrase file such as tests/data/rule_paraphrases.jsonl, one message a line:
{"id", "family", "fires", "query", "expected", optional "history": [{"type", "topic"}],
"editor_context", "extra_context", "trusted" (default true), "lang"}. `family` is the
family the line was written for and `fires` whether that family should decide it
(false: a hard negative, a message that looks like the family but is not its to
decide). The file measures the rules; it is never training data.

For each family, over every line of the file (a hard negative of one family may be
decided by another):
    precision = of the lines the family decides, the share whose expected type it gives
    coverage  = of the lines written for the family with fires=true, the share it decides
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from offline.classifier.inputs import HistoryItem, decode_jsonl, history_entries
from services.classifier.layer1 import FINAL, PRIOR_CONFIDENCE, Family, first_rule
from shared.contracts.routing import QueryType

# A family stays a final decision only at or above this precision (issue 22).
FINAL_PRECISION = 0.99


class ParaphraseLine(msgspec.Struct):
    query: str
    expected: QueryType
    family: Family
    fires: bool
    history: list[HistoryItem] | None = None
    extra_context: str | None = None
    editor_context: str | None = None
    trusted: bool | None = None
    id: str | int | None = None
    lang: str | None = None


def load_paraphrases(path: Path) -> list[ParaphraseLine]:
    return decode_jsonl(path, ParaphraseLine)


def evaluate_rules(lines: list[ParaphraseLine]) -> dict[str, Any]:
    fired: dict[Family, int] = dict.fromkeys(Family, 0)
    right: dict[Family, int] = dict.fromkeys(Family, 0)
    positives: dict[Family, int] = dict.fromkeys(Family, 0)
    covered: dict[Family, int] = dict.fromkeys(Family, 0)
    wrong: list[dict[str, Any]] = []
    for n, line in enumerate(lines, 1):
        hit = first_rule(
            line.query, history_entries(line.history), editor_context=line.editor_context or "",
            extra_context=line.extra_context or "",
            trusted=True if line.trusted is None else line.trusted,
        )
        if line.fires:
            positives[line.family] += 1
            covered[line.family] += hit is not None and hit.family == line.family
        if hit is None:
            continue
        fired[hit.family] += 1
        if hit.type == line.expected:
            right[hit.family] += 1
        else:
            wrong.append({"id": line.id if line.id is not None else n,
                          "family": hit.family.value, "query": line.query,
                          "expected": line.expected.value, "decided": hit.type.value})
    families = {
        fam.value: {
            "precision": round(right[fam] / fired[fam], 4) if fired[fam] else None,
            "decided": fired[fam],
            "right": right[fam],
            "coverage": round(covered[fam] / positives[fam], 4) if positives[fam] else None,
            "positives": positives[fam],
            "final": fam in FINAL,
            "confidence": 1.0 if fam in FINAL else PRIOR_CONFIDENCE.get(fam),
        }
        for fam in Family
    }
    return {"n": len(lines), "families": families, "final_precision": FINAL_PRECISION,
            "wrong": wrong}


def run_eval_rules(*paths: Path) -> dict[str, Any]:
    """The families measured on every line of `paths` together."""
    report = evaluate_rules([line for path in paths for line in load_paraphrases(path)])
    report["files"] = [str(p) for p in paths]
    return report
