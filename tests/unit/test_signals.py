"""The counts every exporter reads (shared.runtime.signals) and how `intentroute status` turns two
readings into rows (intentroute.status), without a server."""

from __future__ import annotations

from pathlib import Path

import pytest

from intentroute.status import Instance, Sample, parse_stats, stage_rows
from shared.runtime.signals import (
    LATENCY_BUCKETS,
    Lag,
    Outcome,
    StageStats,
    bucket_delta,
    merge_buckets,
    quantile,
)


def test_a_stage_counts_outcomes_latency_buckets_and_redeliveries() -> None:
    stats = StageStats("classifier")
    stats.record(Outcome.OK, 0.004)
    stats.record(Outcome.OK, 0.004, deliveries=2)
    stats.record(Outcome.RETRY, 0.2)
    stats.record(Outcome.DEAD_LETTER, 120.0, deliveries=20)
    stats.record(Outcome.DUPLICATE, 0.0001, deliveries=3)
    assert stats.handled == 5
    assert stats.errors == 2  # retry + dead letter; a dropped duplicate is no error
    assert stats.dead_letters == 1
    assert stats.redelivered == 3
    assert stats.processing_ns == pytest.approx(120.2081e9, rel=1e-6)
    assert sum(stats.buckets) == 5
    assert stats.buckets[LATENCY_BUCKETS.index(0.005)] == 2  # 4 ms: the (2.5, 5] ms bucket
    assert stats.buckets[-1] == 1  # over the last bound
    assert stats.snapshot()["outcomes"] == {"ok": 2, "error": 0, "retry": 1,
                                            "dead_letter": 1, "duplicate": 1, "failed": 0}


def test_quantiles_interpolate_inside_their_bucket() -> None:
    bounds = (0.01, 0.1, 1.0)
    assert quantile([0, 0, 0, 0], 0.95, bounds) is None
    assert quantile([10, 0, 0, 0], 0.5, bounds) == pytest.approx(0.005)
    # 90 fast, 10 in (0.1, 1]: the p95 is half-way through the slow bucket.
    assert quantile([90, 0, 10, 0], 0.95, bounds) == pytest.approx(0.55)
    assert quantile([0, 0, 0, 5], 0.95, bounds) == 1.0  # overflow: its lower bound


def test_bucket_deltas_start_over_when_a_replica_restarted() -> None:
    assert bucket_delta([5, 3], [2, 1]) == [3, 2]
    assert bucket_delta([1, 0], [2, 1]) == [1, 0]  # counters went back: a new process
    assert bucket_delta([1, 0], None) == [1, 0]
    assert merge_buckets([[1, 2], [3, 4]]) == [4, 6]


def _inst(rid: str, stage: str, handled: int, fast: int = 0, slow: int = 0) -> Instance:
    buckets = [0] * (len(LATENCY_BUCKETS) + 1)
    buckets[LATENCY_BUCKETS.index(0.005)] = fast
    buckets[LATENCY_BUCKETS.index(0.25)] = slow
    service = "intentroute-" + stage
    return Instance(id=rid, service=service, stage=stage, handled=handled, errors=0,
                    processing_ns=handled * 1_000_000, buckets=buckets)


def test_rows_give_replicas_lag_rate_and_p95_per_stage() -> None:
    lag = {"classifier": Lag(pending=4, ack_pending=2), "retriever": Lag(pending=50)}
    before = Sample(at=100.0, lag=lag, dead_letters={}, instances=[
        _inst("a", "classifier", 100, fast=100), _inst("b", "classifier", 40, fast=40)])
    after = Sample(at=102.0, lag=lag, dead_letters={"retriever": 3}, instances=[
        _inst("a", "classifier", 180, fast=170, slow=10),
        _inst("b", "classifier", 10, fast=10),  # restarted: counts from zero
        _inst("c", "classifier", 10, fast=10)])  # new since the first reading
    rows = {r.stage: r for r in stage_rows(after, before)}
    # The stages in pipeline order, then the workers that read no stage.
    assert list(rows) == ["gateway", "classifier", "retriever", "generator-main",
                          "generator-conversational", "validator", "doors", "learner"]
    assert rows["doors"].pending is None
    classifier = rows["classifier"]
    assert classifier.replicas == 3
    assert (classifier.pending, classifier.ack_pending) == (4, 2)
    assert classifier.rate_per_s == (80 + 10 + 10) / 2
    # In the window: 90 fast and 10 slow (0.1, 0.25] s: the p95 lies in the slow bucket.
    assert classifier.p95_ms == pytest.approx(175.0)
    assert classifier.handled == 200
    retriever = rows["retriever"]
    assert (retriever.replicas, retriever.pending, retriever.dead_letters) == (0, 50, 3)
    assert retriever.rate_per_s == 0
    assert retriever.p95_ms is None
    assert rows["gateway"].pending is None  # no consumer: the stage never started
    one = {r.stage: r for r in stage_rows(after)}
    assert one["classifier"].rate_per_s is None
    assert one["classifier"].p95_ms_all is not None


def test_a_services_api_stats_reply_parses_into_instances() -> None:
    reply = {"name": "intentroute-validator", "id": "X1", "metadata": {"pid": "7"},
             "endpoints": [{"name": "validator", "num_requests": 5, "num_errors": 1,
                            "processing_time": 10, "data": {
                                "buckets": [1, 4], "inflight": 2,
                                "breakers": {"parser": "OPEN"}}}]}
    (inst,) = parse_stats(reply)
    assert (inst.id, inst.stage, inst.handled, inst.errors, inst.inflight) == (
        "X1", "validator", 5, 1, 2)
    assert inst.breakers == {"parser": "OPEN"}
    row = {r.stage: r for r in stage_rows(Sample(at=1, instances=[inst], lag={},
                                                 dead_letters={}))}["validator"]
    assert row.breakers == {"parser": "OPEN"}
    assert row.instances[0]["pid"] == "7"


def test_up_gives_each_worker_process_its_own_metrics_port(tmp_path: Path) -> None:
    import json

    from intentroute.stack.scrape import metrics_ports, write_targets

    counts = {"gateway": 1, "classifier": 2, "validator": 0}
    assert metrics_ports(counts, 0) == []
    plan = metrics_ports(counts, 9464)
    assert plan == [("gateway", 9464), ("classifier", 9465), ("classifier", 9466)]
    write_targets(tmp_path / "t.json", plan, "0.0.0.0")
    groups = json.loads((tmp_path / "t.json").read_text())
    assert groups[1] == {"targets": ["127.0.0.1:9465"], "labels": {"worker": "classifier"}}


def test_the_status_table_shows_every_stage_and_flags_a_backlog_without_replicas() -> None:
    from rich.console import Console

    from intentroute.cli.status_cmd import render

    sample = Sample(at=1.0, lag={"retriever": Lag(pending=7)}, dead_letters={},
                    instances=[_inst("a", "classifier", 5, fast=5)])
    console = Console(record=True, width=200)
    console.print(render(stage_rows(sample), 1.0))
    text = console.export_text()
    for stage in ("gateway", "classifier", "retriever", "validator"):
        assert stage in text
    (retriever,) = [line for line in text.splitlines() if "│ retriever" in line]
    assert [cell.strip() for cell in retriever.split("│")[2:4]] == ["0", "7"]
