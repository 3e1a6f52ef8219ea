"""Every metric a worker exports, read from the instruments themselves
(`docs/reference/metrics.md`, `intentroute docs metrics`).

A `shared.runtime.metrics.Metrics` is built on a worker's signals with one stage of
each kind of figure (a delivery of every outcome, a consumer's lag, a parked dead
letter, a breaker), and read twice: through an in-memory OpenTelemetry reader (the
instrument names OTLP carries, their kind, unit, description and attribute keys) and
through the Prometheus registry a worker serves on `/metrics` (the names and types
Prometheus shows). Nothing listens and nothing connects; the page is the same on every
run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from intentroute.docs.markdown import GENERATED, code, table, text

DEFAULT_OUT = Path("docs/reference/metrics.md")


@dataclass(frozen=True)
class Metric:
    otel_name: str
    prometheus: str
    kind: str  # Prometheus' type
    unit: str
    labels: tuple[str, ...]
    description: str


def metrics() -> list[Metric]:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.resources import Resource
    from prometheus_client.parser import text_string_to_metric_families

    from shared.runtime.metrics import Metrics
    from shared.runtime.signals import Lag, Outcome, WorkerSignals

    signals = WorkerSignals(service="intentroute-docs")
    stats = signals.stage("stage")
    for outcome in Outcome:
        stats.record(outcome, 0.01, deliveries=2)
    signals.lag["stage"] = Lag(pending=1, ack_pending=1, redelivered=1, waiting=1)
    signals.dead_letters_stored["stage"] = 1
    signals.watch_breaker("breaker", lambda: "CLOSED")
    memory = InMemoryMetricReader()
    built = Metrics(signals, resource=Resource.create({}), readers=[memory],
                    prometheus=("127.0.0.1", 0))
    handled = built.on_handled("stage")
    handled(Outcome.OK, 0.01)
    try:
        data = memory.get_metrics_data()
        assert data is not None
        instruments = {m.name: m for rm in data.resource_metrics
                       for sm in rm.scope_metrics for m in sm.metrics}
        from prometheus_client import generate_latest

        families: dict[str, Any] = {f.name: f for f in text_string_to_metric_families(
            generate_latest(built.registry).decode())}
    finally:
        built.provider.shutdown()
    found = []
    for name, instrument in sorted(instruments.items()):
        points: list[Any] = list(instrument.data.data_points)
        labels = tuple(sorted({key for p in points for key in (p.attributes or {})}))
        family = _family(name, instrument.unit or "", families)
        found.append(Metric(name, family.name + _suffix(family.type), family.type,
                            instrument.unit or "", labels, instrument.description or ""))
    return found


def outcomes() -> list[tuple[str, str]]:
    """(value, what it means) of each `outcome` label, from the comments of
    `shared.runtime.signals.Outcome`."""
    import inspect
    import re

    from shared.runtime.signals import Outcome

    said = dict(re.findall(r'^\s*\w+ = "(\w+)"\s*#\s*(.+)$', inspect.getsource(Outcome),
                           re.M))
    return [(o.value, said.get(o.value, "")) for o in Outcome]


def _family(name: str, unit: str, families: dict[str, Any]) -> Any:
    """The Prometheus family an instrument becomes (its name, with its unit's word)."""
    base = name.replace(".", "_")
    for candidate in (f"{base}_seconds" if unit == "s" else base, base):
        if candidate in families:
            return families[candidate]
    raise LookupError(f"{name}: no Prometheus family among {sorted(families)}")


def _suffix(kind: str) -> str:
    return "_total" if kind == "counter" else ""


def render() -> str:
    from shared.runtime.signals import LATENCY_BUCKETS

    found = metrics()
    buckets = ", ".join(f"{b:g}" for b in LATENCY_BUCKETS)
    lines = [
        GENERATED.format(command="metrics", source="shared/runtime/metrics.py"), "",
        "# Metrics reference", "",
        "Every metric a worker exports, read from its instruments "
        "(`shared/runtime/metrics.py`): scraped by Prometheus from "
        "`http://METRICS_HOST:METRICS_PORT/metrics` (on under `intentroute up`), and "
        "pushed under the OpenTelemetry names to the exporters `OTEL_METRICS_EXPORTER` "
        "names. [Observability](../guides/operations/observability.md) says how to turn "
        "them on and what to watch.", "",
    ]
    lines += table(("Prometheus name", "type", "labels", "OpenTelemetry instrument",
                    "unit", "what"), (
        (code(m.prometheus), m.kind, ", ".join(code(x) for x in m.labels) or "—",
         code(m.otel_name), code(m.unit) if m.unit else "—", text(m.description))
        for m in found))
    lines += [
        "",
        "How a delivery ended (`outcome`):", "",
        *table(("outcome", "meaning"), ((code(v), text(m)) for v, m in outcomes())), "",
        f"The histogram's buckets (seconds): {buckets}; the services API "
        "(`$SRV.STATS`) carries the same buckets, so `intentroute status` and a "
        "dashboard agree.", "",
        "The `intentroute_consumer_*` gauges and `intentroute_dead_letters_stored` "
        "describe the durable consumer a stage's replicas share: every replica reports "
        "the same value, so aggregate them with `max by (stage)`; the per-replica "
        "counters with `sum by (stage)`.", "",
    ]
    return "\n".join(lines)
