"""`intentroute eval routing`: every line through the real cascade, no NATS.

Input lines: {"query", "expected", "history": [{"type", "topic"}], optional
"extra_context", "editor_context", "query_type", "id"}. Optional fields may be null;
a malformed line raises `InputError` (file, line number, field).
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

from offline.classifier.classification_metrics import macro_f1
from offline.classifier.inputs import HistoryItem, decode_jsonl, history_entries
from services.classifier.adapters import build_classifier, build_llm
from services.classifier.cascade import Cascade, CascadeConfig
from services.classifier.deixis import is_deictic
from services.classifier.layer2.classifier import Layer2Classifier
from services.classifier.layer2.predict import Prediction
from services.classifier.layer3 import ModelLabeler
from services.classifier.ports import LlmLabeler
from services.classifier.rules import has_platform_data, has_platform_prefix
from services.classifier.settings import ClassifierSettings
from shared.contracts.request import AgentRequest
from shared.contracts.routing import (
    HistoryEntry,
    Layer,
    QueryType,
    RoutingDecision,
    slot_for,
)

LAYERS = ("declared", "rules", "embedding", "llm", "fallback")


class EvalLine(msgspec.Struct):
    query: str
    expected: QueryType
    history: list[HistoryItem] | None = None
    extra_context: str | None = None
    editor_context: str | None = None
    query_type: QueryType | None = None
    id: str | int | None = None


class CountingLabeler:
    """Wraps Layer 3 to count and time calls (RC-01: never called for a prefixed query)."""

    def __init__(self, inner: LlmLabeler) -> None:
        self.inner = inner
        self.calls = 0
        self.last: tuple[QueryType | None, float] = (None, 0.0)  # label, milliseconds

    async def label(self, query: str, history: list[HistoryEntry], editor_context: str
                    ) -> QueryType | None:
        self.calls += 1
        started = time.perf_counter()
        label = await self.inner.label(query, history, editor_context)
        self.last = (label, (time.perf_counter() - started) * 1000)
        return label


class Layer3Stats:
    """The messages the cascade was unsure of (decided by Layer 3, or by Layer 2's guess
    when Layer 3 is off or gives no label): how many, how well Layer 3 labels them
    against Layer 2's guess on the same messages, and Layer 3's time per call."""

    def __init__(self) -> None:
        self.reached = self.asked = self.answered = 0
        self.right = self.llm_right = self.guess_right = 0
        self.ms: list[float] = []

    async def record(self, cascade: Cascade, counting: CountingLabeler | None,
                     req: AgentRequest, history: list[HistoryEntry], line: EvalLine,
                     dec: RoutingDecision, *, asked: bool) -> None:
        if dec.layer not in (Layer.LLM, Layer.FALLBACK):
            return
        self.reached += 1
        self.right += dec.type == line.expected
        if not asked or counting is None:
            self.guess_right += dec.type == line.expected
            return
        label, ms = counting.last
        self.asked += 1
        self.ms.append(ms)
        self.answered += label is not None
        self.llm_right += label == line.expected
        cascade.llm = None  # the same message without Layer 3: Layer 2's own guess
        try:
            guess = await cascade.decide(req, history, trusted=True)
        finally:
            cascade.llm = counting
        self.guess_right += guess.type == line.expected

    def report(self) -> dict[str, Any]:
        ms = sorted(self.ms)
        return {
            "reached": self.reached,
            "asked": self.asked,
            "answered": self.answered,
            # The decisions made on these messages (Layer 3's label, or the fallback).
            "accuracy": _ratio(self.right, self.reached),
            # Layer 3's labels alone (a call without a label counts as wrong), and
            # Layer 2's guess on the same messages.
            "llm_accuracy": _ratio(self.llm_right, self.asked),
            "layer2_accuracy": _ratio(self.guess_right, self.reached),
            "p50_ms": round(statistics.median(ms), 1) if ms else None,
            "p95_ms": round(ms[math.ceil(0.95 * len(ms)) - 1], 1) if ms else None,
        }


def _ratio(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def load_lines(path: Path) -> list[EvalLine]:
    return decode_jsonl(path, EvalLine)


async def evaluate_routing(
    lines: list[EvalLine], cascade: Cascade, *, predictions_out: Path | None = None
) -> dict[str, Any]:
    counting = CountingLabeler(cascade.llm) if cascade.llm is not None else None
    cascade.llm = counting
    predictions: list[dict[str, Any]] = []
    latencies: list[float] = []
    layers: Counter[str] = Counter()
    y_true: list[QueryType] = []
    y_pred: list[QueryType] = []
    invariant = considered = 0
    violations: Counter[str] = Counter()
    layer3 = Layer3Stats()

    for i, line in enumerate(lines, 1):
        req = AgentRequest(
            request_id=f"eval-{i}", session_id="eval", agent_id="eval", query=line.query,
            query_type=line.query_type.value if line.query_type else None,
            extra_context=line.extra_context or "", editor_context=line.editor_context or "",
        )
        history = history_entries(line.history)
        calls_before = counting.calls if counting else 0
        started = time.perf_counter()
        # The sets stand for platform traffic: a trusted agent (declared types, RC-01).
        dec = await cascade.decide(req, history, trusted=True)
        latencies.append((time.perf_counter() - started) * 1000)
        llm_called = bool(counting and counting.calls > calls_before)
        await layer3.record(cascade, counting, req, history, line, dec, asked=llm_called)
        layers[dec.layer.value] += 1
        y_true.append(line.expected)
        y_pred.append(dec.type)
        predictions.append({
            "id": line.id if line.id is not None else i,
            "predicted": dec.type.value,
            "layer": dec.layer.value,
            "confidence": dec.confidence,
            "clarity": dec.clarity.value,
        })
        violations.update(_violations(line, dec, llm_called=llm_called))
        if not is_deictic(line.query):
            considered += 1
            if await _invariant_under_history(cascade, req, dec):
                invariant += 1
            else:
                violations["RC-03"] += 1

    report: dict[str, Any] = {
        "n": len(lines),
        "accuracy": round(sum(t == p for t, p in zip(y_true, y_pred, strict=True))
                          / max(1, len(lines)), 4),
        "macro_f1": round(macro_f1([t.value for t in y_true], [p.value for p in y_pred]), 4),
        "per_type": per_type(y_true, y_pred),
        "layer_share": {name: round(layers[name] / max(1, len(lines)), 4) for name in LAYERS},
        "history_invariance": round(invariant / max(1, considered), 4),
        # ADR-0008: Layer 3 should see under 5% of the traffic.
        "llm_share": round(layer3.reached / max(1, len(lines)), 4),
        "layer3": layer3.report(),
        "p50_ms": round(statistics.median(latencies), 3) if latencies else 0.0,
        "p99_ms": round(sorted(latencies)[int(0.99 * (len(latencies) - 1))], 3)
        if latencies else 0.0,
        "rc_violations": sum(violations.values()),
        "rc_violations_by_rule": dict(violations),
    }
    if layers[Layer.DEFAULT.value]:
        report["layer_share"]["default"] = round(layers[Layer.DEFAULT.value] / len(lines), 4)
    if predictions_out is not None:
        with predictions_out.open("w", encoding="utf-8") as fh:
            for row in predictions:
                fh.write(json.dumps(row) + "\n")
    return report


async def _invariant_under_history(cascade: Cascade, req: AgentRequest,
                                   dec: RoutingDecision) -> bool:
    """RC-03: 5 entries of each other type in the history change nothing."""
    for other in QueryType:
        if other == dec.type:
            continue
        swapped = [HistoryEntry(other, f"earlier {other.value.lower()} turn")] * 5
        if (await cascade.decide(req, swapped, trusted=True)).type != dec.type:
            return False
    return True


def _violations(line: EvalLine, dec: RoutingDecision, *,
                llm_called: bool) -> list[str]:
    found = []
    declared = bool(line.query_type)
    if has_platform_prefix(line.query) and not declared and (
        dec.type != QueryType.PLATFORM or llm_called
    ):
        found.append("RC-01")
    if not declared and has_platform_data(line.query, line.extra_context or "") and (
        dec.type != QueryType.PLATFORM
    ):
        found.append("RC-02")
    if dec.model_slot != slot_for(dec.type):
        found.append("RC-05")
    # RC-06 holds by construction: `_history` hands the cascade at most the last 6.
    return found


def per_type(y_true: list[QueryType], y_pred: list[QueryType]) -> dict[str, dict[str, float]]:
    out = {}
    for t in QueryType:
        tp = sum(a == t and b == t for a, b in zip(y_true, y_pred, strict=True))
        predicted = sum(b == t for b in y_pred)
        actual = sum(a == t for a in y_true)
        out[t.value] = {
            "precision": round(tp / predicted, 4) if predicted else 0.0,
            "recall": round(tp / actual, 4) if actual else 0.0,
            "support": actual,
        }
    return out


class DirectLayer2:
    """Layer 2 without the worker's micro-batcher (one message at a time)."""

    def __init__(self, classifier: Layer2Classifier) -> None:
        self.classifier = classifier

    async def predict(self, text: str) -> Prediction:
        return self.classifier.classify(text)


def run_eval_routing(path: Path, settings: ClassifierSettings, *, threshold: float,
                     predictions_out: Path | None) -> dict[str, Any]:
    """The worker's cascade as `settings` configure it (Layer 2 from its head registry,
    seeded like the worker's; Layer 3 on the model server they name, if any), at
    `threshold`."""
    lines = load_lines(path)  # a malformed line fails before any model is loaded
    classifier = build_classifier(settings, threshold=threshold)
    llm = build_llm(settings)
    cascade = Cascade(CascadeConfig(threshold=threshold),
                      layer2=DirectLayer2(classifier) if classifier is not None else None,
                      llm=llm)

    async def run() -> dict[str, Any]:
        if isinstance(llm, ModelLabeler):
            await llm.warm()  # timed as a running worker's calls are, not cold
        return await evaluate_routing(lines, cascade, predictions_out=predictions_out)

    return asyncio.run(run())
