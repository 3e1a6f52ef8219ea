"""`intentroute eval multi`: each message split (services/classifier/split.py), each part
routed by the real cascade, offline (no NATS), as `eval routing` runs it.

Input lines: {"id", "query", "parts": [{"text", "expected"}], "lang", "kind":
"multi"|"single"}, optional "history", "extra_context", "editor_context" (as in the
routing sets). A "single" line has one part, a "multi" line two or more; a malformed
line raises `InputError` (file, line number, field).

Each part is routed with the line's history extended by the parts before it (their
decided type and topic), which is how the cascade is meant to see them in the
pipeline: the intent history updated per part, so "¿y endLoop?" after "¿qué hace
startLoop?" finds its referent (RC-03), and with the line's extra_context /
editor_context, which belong to the whole message (RC-02 holds per part).

Figures (each also by `lang`):

    exact_set_accuracy     the predicted parts have exactly the expected types, in order
    split_accuracy         the right number of parts
    singles_wrongly_split  share of single-request controls cut into several parts
    part_routing_accuracy  parts routed to their expected type, over the lines split
                           into the right number of parts (routing apart from splitting)
    single_routing_accuracy  the cascade on the whole message, single-request lines:
                           the baseline part routing is compared with
    gold_part_routing_accuracy  the expected parts' own texts routed the same way
                           (routing of parts with a perfect splitter)
    split_precision / split_recall  messages cut, against messages carrying several
                           requests
    clarity_gate           today's ADR-018 gate on the whole message: multi-request
                           lines it flags `multi_intent`, single ones it flags wrongly
    same_type_merged       a policy to weigh: neighbouring parts routed to one type
                           answered as one part (the expected parts merged the same way)
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import msgspec

from offline.classifier.inputs import (
    HistoryItem,
    InputError,
    decode_jsonl,
    history_entries,
    read_lines,
)
from services.classifier.cascade import Cascade, CascadeConfig
from services.classifier.split import Split, split
from shared.contracts.request import AgentRequest
from shared.contracts.routing import (
    HISTORY_WINDOW,
    Clarity,
    HistoryEntry,
    QueryType,
    RoutingDecision,
    topic_snippet,
)

KEYS = ("exact_set_accuracy", "split_accuracy", "singles_wrongly_split",
        "part_routing_accuracy", "single_routing_accuracy")


class ExpectedPart(msgspec.Struct):
    text: str
    expected: QueryType


class MultiLine(msgspec.Struct):
    query: str
    parts: list[ExpectedPart]
    lang: str
    kind: Literal["multi", "single"]
    id: str | int | None = None
    history: list[HistoryItem] | None = None
    extra_context: str | None = None
    editor_context: str | None = None


def load_multi(path: Path) -> list[MultiLine]:
    """The set's lines; a line whose `kind` disagrees with its number of parts, or whose
    parts are empty, is an `InputError` naming it."""
    lines = decode_jsonl(path, MultiLine)
    for (number, _), line in zip(read_lines(path), lines, strict=True):
        if not line.parts:
            raise InputError(path, number, "parts", "at least one part")
        if (line.kind == "single") != (len(line.parts) == 1):
            raise InputError(path, number, "kind",
                             f"{line.kind!r} with {len(line.parts)} part(s)")
        if any(not p.text.strip() for p in line.parts):
            raise InputError(path, number, "parts", "a part with no text")
    return lines


class Routed(msgspec.Struct, frozen=True):
    text: str
    start: int
    end: int
    type: QueryType
    layer: str
    confidence: float


def _request(line: MultiLine, text: str, n: int, i: int) -> AgentRequest:
    return AgentRequest(
        request_id=f"eval-{n}-{i}", session_id="eval", agent_id="eval", query=text,
        extra_context=line.extra_context or "", editor_context=line.editor_context or "")


async def route_parts(cascade: Cascade, line: MultiLine, texts: Iterable[str], n: int
                      ) -> list[RoutingDecision]:
    """Each part through the cascade, the history extended by the parts before it."""
    history = history_entries(line.history)
    decisions = []
    for i, text in enumerate(texts):
        # The sets stand for platform traffic: a trusted agent, as in `eval routing`.
        dec = await cascade.decide(_request(line, text, n, i), history[-HISTORY_WINDOW:],
                                   trusted=True)
        decisions.append(dec)
        history = [*history, HistoryEntry(dec.type, topic_snippet(text))]
    return decisions


class _Tally:
    """Counts for one group of lines (all of them, or one language)."""

    def __init__(self) -> None:
        self.n = self.exact = self.split_right = 0
        self.singles = self.singles_split = 0
        self.multis = self.multis_cut = self.cut = 0
        self.parts = self.parts_right = 0
        self.gold_parts = self.gold_right = 0
        self.single_right = 0
        self.gate_multi = self.gate_single = 0
        self.merged_exact = self.merged_singles_split = 0

    def report(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "exact_set_accuracy": _ratio(self.exact, self.n),
            "split_accuracy": _ratio(self.split_right, self.n),
            "singles_wrongly_split": _ratio(self.singles_split, self.singles),
            "part_routing_accuracy": _ratio(self.parts_right, self.parts),
            "single_routing_accuracy": _ratio(self.single_right, self.singles),
            "gold_part_routing_accuracy": _ratio(self.gold_right, self.gold_parts),
            "split_precision": _ratio(self.multis_cut, self.cut),
            "split_recall": _ratio(self.multis_cut, self.multis),
        }

    def merged_report(self) -> dict[str, Any]:
        return {"exact_set_accuracy": _ratio(self.merged_exact, self.n),
                "singles_wrongly_split": _ratio(self.merged_singles_split, self.singles)}


def _ratio(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


async def evaluate_multi(lines: list[MultiLine], cascade: Cascade, *,
                         predictions_out: Path | None = None) -> dict[str, Any]:
    """Every line split and routed part by part; the figures described above."""
    overall = _Tally()
    by_lang: dict[str, _Tally] = defaultdict(_Tally)
    by_parts: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    rows: list[dict[str, Any]] = []
    split_us: list[float] = []
    wrong: list[dict[str, Any]] = []
    layers: Counter[str] = Counter()

    for n, line in enumerate(lines, 1):
        started = time.perf_counter()
        cut: Split = split(line.query)
        split_us.append((time.perf_counter() - started) * 1e6)
        decisions = await route_parts(cascade, line, (p.query for p in cut.parts), n)
        gold = await route_parts(cascade, line, (p.text for p in line.parts), n)
        whole = await cascade.decide(_request(line, line.query, n, -1),
                                     history_entries(line.history), trusted=True)
        expected = [p.expected for p in line.parts]
        predicted = [d.type for d in decisions]
        layers.update(d.layer.value for d in decisions)
        exact = predicted == expected
        by_parts[len(expected)][0] += 1
        by_parts[len(expected)][1] += exact
        for tally in (overall, by_lang[line.lang]):
            _count(tally, line, cut, predicted, expected, [d.type for d in gold], whole)
        routed = [Routed(p.text, p.start, p.end, d.type, d.layer.value, d.confidence)
                  for p, d in zip(cut.parts, decisions, strict=True)]
        row = {"id": line.id if line.id is not None else n, "lang": line.lang,
               "kind": line.kind, "expected": [t.value for t in expected],
               "predicted": msgspec.to_builtins(routed), "exact": exact,
               "split_ok": len(predicted) == len(expected)}
        rows.append(row)
        if not exact:
            wrong.append({"id": row["id"], "query": line.query,
                          "expected": row["expected"],
                          "predicted": [[r.text, r.type.value] for r in routed]})

    report: dict[str, Any] = overall.report()
    report["n_multi"] = overall.multis
    report["n_single"] = overall.singles
    report["by_lang"] = {lang: tally.report() for lang, tally in sorted(by_lang.items())}
    report["exact_set_accuracy_by_parts"] = {
        str(k): _ratio(right, total) for k, (total, right) in sorted(by_parts.items())}
    report["same_type_merged"] = {**overall.merged_report(), "by_lang": {
        lang: tally.merged_report() for lang, tally in sorted(by_lang.items())}}
    report["clarity_gate"] = {
        "multi_flagged": _ratio(overall.gate_multi, overall.multis),
        "singles_flagged": _ratio(overall.gate_single, overall.singles)}
    total_parts = sum(layers.values())
    report["part_layer_share"] = {name: round(count / total_parts, 4)
                                  for name, count in sorted(layers.items())}
    ordered = sorted(split_us)
    report["split_p50_us"] = round(statistics.median(ordered), 1) if ordered else None
    report["split_p99_us"] = round(ordered[int(0.99 * (len(ordered) - 1))], 1) \
        if ordered else None
    report["wrong"] = wrong
    if predictions_out is not None:
        with predictions_out.open("w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return report


def _count(tally: _Tally, line: MultiLine, cut: Split, predicted: list[QueryType],
           expected: list[QueryType], gold: list[QueryType], whole: RoutingDecision) -> None:
    tally.n += 1
    tally.exact += predicted == expected
    merged = _collapse(predicted)
    tally.merged_exact += merged == _collapse(expected)
    if line.kind == "single":
        tally.merged_singles_split += len(merged) > 1
    right_count = len(predicted) == len(expected)
    tally.split_right += right_count
    tally.cut += cut.multi
    if line.kind == "single":
        tally.singles += 1
        tally.singles_split += cut.multi
        tally.single_right += whole.type == expected[0]
        tally.gate_single += whole.clarity == Clarity.MULTI_INTENT
    else:
        tally.multis += 1
        tally.multis_cut += cut.multi
        tally.gate_multi += whole.clarity == Clarity.MULTI_INTENT
    if right_count:
        tally.parts += len(expected)
        tally.parts_right += sum(p == e for p, e in zip(predicted, expected, strict=True))
    tally.gold_parts += len(expected)
    tally.gold_right += sum(g == e for g, e in zip(gold, expected, strict=True))


def _collapse(types: list[QueryType]) -> list[QueryType]:
    """Neighbouring parts of one type as one part."""
    return [t for i, t in enumerate(types) if i == 0 or types[i - 1] != t]


def controls_from_routing(path: Path) -> list[MultiLine]:
    """A routing set's lines (`eval routing`'s format) as single-request controls: each
    is one request of its expected type, whatever its wording."""
    from offline.classifier.routing_eval import load_lines

    return [MultiLine(query=line.query, parts=[ExpectedPart(line.query, line.expected)],
                      lang="-", kind="single", id=line.id, history=line.history,
                      extra_context=line.extra_context, editor_context=line.editor_context)
            for line in load_lines(path)]


async def evaluate_controls(lines: list[MultiLine], cascade: Cascade) -> dict[str, Any]:
    """Single-request messages written for another purpose: how many are cut."""
    full = await evaluate_multi(lines, cascade)
    return {"n": full["n"], "singles_wrongly_split": full["singles_wrongly_split"],
            "same_type_merged_singles_wrongly_split":
                full["same_type_merged"]["singles_wrongly_split"],
            "exact_set_accuracy": full["exact_set_accuracy"],
            "single_routing_accuracy": full["single_routing_accuracy"],
            "cut": [w for w in full["wrong"] if len(w["predicted"]) > 1]}


def run_eval_multi(path: Path | None, settings: Any, *, threshold: float,
                   predictions_out: Path | None,
                   controls: list[Path] | None = None) -> dict[str, Any]:
    """The worker's cascade as `settings` configure it (as `eval routing` builds it).
    `controls`: routing sets whose every line is one request (how many are cut)."""
    from offline.classifier.routing_eval import DirectLayer2
    from services.classifier.adapters import build_classifier, build_llm
    from services.classifier.layer3 import ModelLabeler

    # A malformed line fails before any model is loaded.
    lines = load_multi(path) if path is not None else []
    control_sets = {str(p): controls_from_routing(p) for p in controls or []}
    classifier = build_classifier(settings, threshold=threshold)
    llm = build_llm(settings)
    cascade = Cascade(CascadeConfig(threshold=threshold),
                      layer2=DirectLayer2(classifier) if classifier is not None else None,
                      llm=llm)

    async def run() -> dict[str, Any]:
        if isinstance(llm, ModelLabeler):
            await llm.warm()
        report = await evaluate_multi(lines, cascade, predictions_out=predictions_out) \
            if path is not None else {}
        if control_sets:
            report["controls"] = {name: await evaluate_controls(mine, cascade)
                                  for name, mine in control_sets.items()}
        return report

    return asyncio.run(run())
