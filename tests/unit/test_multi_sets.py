"""The multi-intent sets (issue 34) are well formed: every line reads as `eval multi`
reads it, its parts are pieces of its query in order, and each set has what the issue
asks of it (EN and ES, 2-4 parts of the four types, >= 40% single-request controls).
Also the MixATIS reader, on a file written here in AGIF's format."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from offline.classifier.inputs import InputError
from offline.classifier.mixatis import AtisLine, evaluate_mixatis, read_agif
from offline.classifier.multi_eval import load_multi
from shared.contracts.routing import QueryType

DATA = Path(__file__).resolve().parents[1] / "data"
# The tuning set; a held-out set written after the splitter was first frozen; a fresh
# one written after its revision on the held-out set's failures (docs/_handoff).
SETS = {"multi_intent.jsonl": 150, "multi_intent_heldout.jsonl": 60,
        "multi_intent_fresh.jsonl": 60}


@pytest.mark.parametrize(("name", "minimum"), SETS.items())
def test_a_multi_intent_set_is_well_formed(name: str, minimum: int) -> None:
    path = DATA / name
    lines = load_multi(path)
    raw = [json.loads(row) for row in path.read_text(encoding="utf-8").splitlines()
           if row.strip()]
    assert len(lines) >= minimum
    ids = [line.id for line in lines]
    assert None not in ids
    assert len(set(ids)) == len(ids)
    assert {line.lang for line in lines} == {"en", "es"}
    kinds = Counter(line.kind for line in lines)
    assert kinds["single"] >= 0.4 * len(lines)
    for line, row in zip(lines, raw, strict=True):
        assert set(row) <= {"id", "query", "parts", "lang", "kind", "history",
                            "extra_context", "editor_context", "note"}, line.id
        assert 1 <= len(line.parts) <= 4, line.id
        cursor = 0
        for part in line.parts:  # each part is a piece of the query, in order
            found = line.query.find(part.text, cursor)
            assert found >= 0, (line.id, part.text)
            cursor = found + len(part.text)
        if line.kind == "single":
            assert line.parts[0].text == line.query, line.id
    multi_types = Counter(p.expected for line in lines if line.kind == "multi"
                          for p in line.parts)
    assert set(multi_types) == set(QueryType)
    for lang in ("en", "es"):
        mine = [line for line in lines if line.lang == lang]
        assert {line.kind for line in mine} == {"multi", "single"}


def test_the_sets_share_no_query() -> None:
    queries = [{line.query for line in load_multi(DATA / name)} for name in SETS]
    for i, mine in enumerate(queries):
        for other in queries[i + 1:]:
            assert not mine & other


AGIF = """\
what O
is O
addvar B-command
and O
then O
show O
my O
plan O
intent_docs#intent_plan

write O
an O
endpoint O
intent_code
"""


def test_the_agif_format_is_read_as_utterances_and_intent_sets(tmp_path: Path) -> None:
    path = tmp_path / "test.txt"
    path.write_text(AGIF, encoding="utf-8")
    assert read_agif(path) == [
        AtisLine("what is addvar and then show my plan", ("intent_docs", "intent_plan")),
        AtisLine("write an endpoint", ("intent_code",))]
    path.write_text("what O\nis O extra\n", encoding="utf-8")
    with pytest.raises(InputError) as caught:
        read_agif(path)
    assert caught.value.line == 2
    with pytest.raises(InputError):
        read_agif(tmp_path / "missing.txt")


def test_mixatis_figures_count_a_message_right_only_with_its_whole_intent_set() -> None:
    class Keyword:
        def predict(self, texts: list[str]) -> list[str]:
            return ["plan" if "plan" in t else "code" if "endpoint" in t else "docs"
                    for t in texts]

    test = [AtisLine("what is addvar and then show my plan", ("docs", "plan")),
            AtisLine("write an endpoint and then show my plan", ("code", "plan")),
            AtisLine("what is addvar and addparam", ("docs",)),
            AtisLine("what is addvar and my plan", ("docs", "plan"))]  # not cut: wrong
    report = evaluate_mixatis(test, Keyword(),  # type: ignore[arg-type]
                              singles=[AtisLine("show my plan", ("plan",))])
    assert report["exact_set_intent_accuracy"] == 0.75
    assert report["split_accuracy"] == 0.75
    assert report["exact_set_intent_accuracy_when_split_right"] == 1.0
    assert report["atis_single"] == {"n": 1, "intent_accuracy": 1.0,
                                     "singles_wrongly_split": 0.0}
