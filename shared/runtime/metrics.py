"""A worker's signals as OpenTelemetry metrics: scraped by Prometheus (METRICS_PORT),
pushed to the exporters OTEL_METRICS_EXPORTER names (OTLP, console), or both.

Off unless some exporter is chosen (shared.common.otel: `prometheus` when METRICS_PORT
is set, `otlp` when an OTLP endpoint is): then, with `prometheus`, the worker serves
`/metrics` on `metrics_host:metrics_port` from a registry of its own; pushing readers
export every OTEL_METRIC_EXPORT_INTERVAL; and a poller asks the server for its stages'
consumer lag every `metrics_interval` seconds. Names as Prometheus shows them (every
series has a `stage` label unless said otherwise; OTLP carries the instrument names,
`intentroute.stage.duration`, ...):

    intentroute_stage_duration_seconds   histogram, + `outcome`: handling time
    intentroute_stage_messages_total     + `outcome` (ok, error, retry, dead_letter, ...)
    intentroute_stage_redeliveries_total deliveries that were not the first
    intentroute_stage_dead_letters_total messages this replica dead-lettered
    intentroute_stage_inflight           messages being handled now
    intentroute_stage_waiting            messages held here waiting their agent's turn
    intentroute_consumer_pending         lag: in the stream, not delivered yet
    intentroute_consumer_ack_pending     delivered, not acknowledged yet
    intentroute_consumer_redelivered     redelivered, not acknowledged yet
    intentroute_consumer_waiting         pull requests waiting (idle replicas)
    intentroute_dead_letters_stored      parked in the dead-letter stream
    intentroute_breaker_state            `breaker` label: 0 closed, 1 half-open, 2 open

The consumer figures are the durable consumer's, shared by the stage's replicas: every
replica reports the same value (aggregate them with `max by (stage)`, not `sum`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from nats.js import JetStreamContext
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

from shared.common.tasks import cancel_and_wait
from shared.contracts import deadletter
from shared.runtime.consumer import OnHandled, StageSpec, per_agent_lag
from shared.runtime.signals import BREAKER_LEVELS, LATENCY_BUCKETS, Lag, Outcome, WorkerSignals

log = logging.getLogger("intentroute.metrics")

DURATION = "intentroute.stage.duration"


class Metrics:
    """The worker's meter provider, its readers (a Prometheus endpoint, pushing
    exporters) and its lag poller."""

    def __init__(self, signals: WorkerSignals, *, resource: Resource,
                 readers: Sequence[MetricReader] = (),
                 prometheus: tuple[str, int] | None = None) -> None:
        """`prometheus`: (host, port) of the scrape endpoint; None: no endpoint."""
        self.signals = signals
        self.registry: Any = None
        all_readers = list(readers)
        if prometheus is not None:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import CollectorRegistry

            # A registry per worker: replicas run in tests within one process.
            self.registry = CollectorRegistry(auto_describe=True)
            # Without the otel_scope_* labels: every series comes from one scope.
            all_readers.append(PrometheusMetricReader(registry=self.registry,
                                                      scope_info_enabled=False))
        self.provider = MeterProvider(
            resource=resource, metric_readers=all_readers,
            views=[View(instrument_name=DURATION, aggregation=ExplicitBucketHistogramAggregation(
                boundaries=LATENCY_BUCKETS))])
        self._host, self._port = prometheus or ("", 0)
        self._server: Any = None
        self._poller: asyncio.Task[None] | None = None
        self._instruments()

    @property
    def address(self) -> str:
        return f"{self._host}:{self._port}"

    def _instruments(self) -> None:
        meter = self.provider.get_meter("intentroute")
        self._duration = meter.create_histogram(
            DURATION, unit="s", description="Time a stage took to handle one delivery")
        signals = self.signals

        def per_stage(read: Callable[[Any], float]) -> Callable[[CallbackOptions],
                                                                 Iterable[Observation]]:
            def callback(_: CallbackOptions) -> Iterable[Observation]:
                return [Observation(read(stats), {"stage": name})
                        for name, stats in list(signals.stages.items())]
            return callback

        def per_lag(read: Callable[[Lag], int]) -> Callable[[CallbackOptions],
                                                             Iterable[Observation]]:
            def callback(_: CallbackOptions) -> Iterable[Observation]:
                return [Observation(read(lag), {"stage": name})
                        for name, lag in list(signals.lag.items())]
            return callback

        def messages(_: CallbackOptions) -> Iterable[Observation]:
            return [Observation(count, {"stage": name, "outcome": outcome})
                    for name, stats in list(signals.stages.items())
                    for outcome, count in stats.outcomes.items()]

        def stored(_: CallbackOptions) -> Iterable[Observation]:
            return [Observation(count, {"stage": name})
                    for name, count in list(signals.dead_letters_stored.items())]

        def breakers(_: CallbackOptions) -> Iterable[Observation]:
            return [Observation(BREAKER_LEVELS.get(state, -1), {"breaker": name})
                    for name, state in signals.breaker_states().items()]

        meter.create_observable_counter(
            "intentroute.stage.messages", [messages],
            description="Deliveries handled, by outcome")
        meter.create_observable_counter(
            "intentroute.stage.redeliveries", [per_stage(lambda s: s.redelivered)],
            description="Deliveries that were not a message's first")
        meter.create_observable_counter(
            "intentroute.stage.dead_letters", [per_stage(lambda s: s.dead_letters)],
            description="Messages this replica moved to the dead-letter stream")
        meter.create_observable_gauge(
            "intentroute.stage.inflight", [per_stage(lambda s: s.inflight)],
            description="Messages being handled now")
        meter.create_observable_gauge(
            "intentroute.stage.waiting", [per_stage(lambda s: s.waiting)],
            description="Messages this replica holds, waiting their agent's turn "
                        "(STAGE_LOOKAHEAD)")
        for field, text in (("pending", "Messages in the stream not yet delivered"),
                            ("ack_pending", "Messages delivered, not yet acknowledged"),
                            ("redelivered", "Redelivered messages not yet acknowledged"),
                            ("waiting", "Pull requests waiting for messages")):
            meter.create_observable_gauge(
                f"intentroute.consumer.{field}",
                [per_lag(_lag_field(field))], description=text)
        meter.create_observable_gauge(
            "intentroute.dead_letters.stored", [stored],
            description="Dead letters parked in the dead-letter stream")
        meter.create_observable_gauge(
            "intentroute.breaker.state", [breakers],
            description="Circuit breaker state: 0 closed, 1 half-open, 2 open")

    def on_handled(self, stage: str) -> OnHandled:
        """The stage consumer's hook: one histogram record per delivery."""
        attributes = {o: {"stage": stage, "outcome": o.value} for o in Outcome}
        record = self._duration.record

        def handled(outcome: Outcome, seconds: float) -> None:
            record(seconds, attributes[outcome])

        return handled

    def serve(self) -> bool:
        """Start the scrape endpoint; False without one, or (logged) when the port is
        taken: the worker goes on without it rather than die and be restarted in a loop."""
        from prometheus_client import start_http_server

        if self.registry is None:
            return False
        try:
            self._server, _ = start_http_server(self._port, addr=self._host,
                                                registry=self.registry)
        except OSError as exc:
            log.error("metrics endpoint %s not started: %s", self.address, exc)
            return False
        log.info("metrics on http://%s/metrics", self.address)
        return True

    def poll(self, js: JetStreamContext, specs: Sequence[StageSpec], interval: float) -> None:
        self._poller = asyncio.create_task(poll_lag(js, self.signals, specs, interval),
                                           name="metrics-lag")

    async def close(self) -> None:
        await cancel_and_wait(self._poller)
        if self._server is not None:
            server, self._server = self._server, None
            await asyncio.to_thread(server.shutdown)
            server.server_close()
        # A pushing reader exports once more (bounded by its exporter's timeout).
        await asyncio.to_thread(self.provider.shutdown)


def _lag_field(name: str) -> Callable[[Lag], int]:
    def read(lag: Lag) -> int:
        return int(getattr(lag, name))

    return read


async def read_lag(js: JetStreamContext, signals: WorkerSignals,
                   specs: Sequence[StageSpec]) -> None:
    """One reading of each stage's consumer and of its parked dead letters."""
    for spec in specs:
        if spec.per_agent:  # the sum over its agents' consumers
            summed = await per_agent_lag(js, spec.stream, spec.durable)
            signals.lag[spec.durable] = summed or Lag()
        else:
            info = await js.consumer_info(spec.stream, spec.durable)
            signals.lag[spec.durable] = Lag(
                pending=info.num_pending or 0, ack_pending=info.num_ack_pending or 0,
                redelivered=info.num_redelivered or 0, waiting=info.num_waiting or 0)
        subject = deadletter.dead_letter_subject(spec.durable)
        dlq = await js.stream_info(deadletter.STREAM, subjects_filter=subject)
        signals.dead_letters_stored[spec.durable] = int(
            (dlq.state.subjects or {}).get(subject, 0))


async def poll_lag(js: JetStreamContext, signals: WorkerSignals, specs: Sequence[StageSpec],
                   interval: float) -> None:
    """Keep the lag fresh; a server away for a while leaves the last reading."""
    while True:
        try:
            await read_lag(js, signals, specs)
        except Exception as exc:
            log.debug("lag not read: %r", exc)
        await asyncio.sleep(interval)
