"""OpenTelemetry for a worker, chosen and configured by the standard OTEL_* variables.

`CommonSettings.otel` (shared.common.otel) says which exporters each signal has; they
are the installed ones, found by their entry points as the SDK's own configuration
finds them (`otlp` is `otlp_proto_grpc` or `otlp_proto_http` by
OTEL_EXPORTER_OTLP[_TRACES|_METRICS]_PROTOCOL). Each exporter then reads its endpoint,
headers, timeout, compression and certificates from the process environment itself
(OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]ENDPOINT, ..._HEADERS, ...), the tracer provider
its sampler (OTEL_TRACES_SAMPLER, _ARG), the resource OTEL_RESOURCE_ATTRIBUTES.

A request's trace starts at the door the caller used (`door_span`: the caller's W3C
`traceparent` continued, from gRPC metadata or HTTP headers) or at the caller's own
NATS headers, and follows the request through every stage in the messages' headers
(shared.runtime.bus, shared.runtime.consumer). Its spans carry the request's ids and,
once it is routed, its query type and deciding layer (shared.common.otel).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from functools import partial
from importlib.metadata import entry_points
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, Tracer
from opentelemetry.trace import TracerProvider as ApiTracerProvider

from shared.common.otel import OtelSettings, request_attributes
from shared.common.settings import SettingError

_NOOP = trace.NoOpTracerProvider()
# OTEL_EXPORTER_OTLP_PROTOCOL -> the exporter's entry point (the SDK's own mapping).
_OTLP = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}
TRACES_GROUP = "opentelemetry_traces_exporter"
METRICS_GROUP = "opentelemetry_metrics_exporter"


def worker_resource(service: str, otel: OtelSettings) -> Resource:
    """The worker's resource: `service.name` OTEL_SERVICE_NAME, else one given in
    OTEL_RESOURCE_ATTRIBUTES, else `intentroute-<worker>`; an instance id per process."""
    detected = dict(OTELResourceDetector().detect().attributes)
    name = otel.service_name or detected.get("service.name") or f"intentroute-{service}"
    return Resource.create({
        "service.instance.id": f"{socket.gethostname()}:{os.getpid()}",
        **detected, "service.name": name})


def exporter_entry(name: str, protocol: str, variable: str) -> str:
    """The entry point of exporter `name`: `otlp` by the OTLP protocol."""
    if name != "otlp":
        return name
    chosen = protocol.strip() or "grpc"
    if chosen not in _OTLP:
        raise SettingError(f"{variable}: expected grpc or http/protobuf, got {chosen!r}")
    return _OTLP[chosen]


def load_exporter(group: str, name: str, variable: str) -> Any:
    """The class an installed package registers as exporter `name` of `group`; a
    SettingError naming the installed ones when there is none."""
    found = list(entry_points(group=group, name=name))
    if not found:
        installed = sorted({"otlp", *(ep.name for ep in entry_points(group=group))})
        raise SettingError(f"{variable}: no exporter {name!r} is installed "
                           f"(installed: {', '.join(installed)}, none)")
    return found[0].load()


def build_tracer_provider(service: str, otel: OtelSettings) -> TracerProvider | None:
    """The worker's tracer provider, a batch processor per exporter; None when no
    exporter is chosen (tracing off: no span is even recorded)."""
    names = otel.traces_exporters()
    if not names:
        return None
    protocol = otel.traces_protocol or otel.protocol
    variable = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" if otel.traces_protocol
                else "OTEL_EXPORTER_OTLP_PROTOCOL")
    exporters = [load_exporter(TRACES_GROUP, exporter_entry(name, protocol, variable),
                               "OTEL_TRACES_EXPORTER")() for name in names]
    provider = TracerProvider(resource=worker_resource(service, otel))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def metric_reader_factories(otel: OtelSettings, names: list[str]
                            ) -> list[Callable[[], MetricReader]]:
    """A reader's factory per pushing exporter in `names` (`prometheus`, served by the
    worker's own endpoint, is not one of them): the classes are found now (a name not
    installed is a SettingError), the readers made when the worker starts; each exports
    every OTEL_METRIC_EXPORT_INTERVAL ms."""
    protocol = otel.metrics_protocol or otel.protocol
    variable = ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL" if otel.metrics_protocol
                else "OTEL_EXPORTER_OTLP_PROTOCOL")
    return [partial(_reader, load_exporter(METRICS_GROUP, exporter_entry(name, protocol, variable),
                                           "OTEL_METRICS_EXPORTER"))
            for name in names if name != "prometheus"]


def _reader(exporter_class: Any) -> MetricReader:
    made = exporter_class()
    return made if isinstance(made, MetricReader) else PeriodicExportingMetricReader(made)


def tracer_for(name: str, provider: ApiTracerProvider | None) -> Tracer:
    """A tracer from the worker's provider; a no-op tracer when tracing is off."""
    return (provider or _NOOP).get_tracer(name)


def door_span(tracer: Tracer, name: str, carrier: Mapping[str, str],
              attributes: Mapping[str, str | int]) -> Span:
    """A SERVER span for a request at a door, the child of the caller's `traceparent`
    in `carrier` (HTTP headers, gRPC metadata) when there is one. Not made current:
    the door passes `trace_headers(span)` on with the request and ends the span when
    the answer ends (a door's handler is a generator: no context to attach across
    its yields)."""
    return tracer.start_span(name, context=propagate.extract(carrier), kind=SpanKind.SERVER,
                             attributes=attributes)


def trace_headers(span: Span) -> dict[str, str]:
    """`traceparent` (and `tracestate`) of `span`, for the request's NATS headers; {}
    when the span records nothing."""
    carrier: dict[str, str] = {}
    if span.get_span_context().is_valid:
        propagate.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def annotate(span: Span | None = None, /, *, request_id: str = "", agent_id: str = "",
             query_type: str = "", layer: str = "") -> None:
    """Put the request's attributes on `span` (default: the current one, the stage's
    consumer span); nothing is built when it records nothing (tracing off)."""
    target = span or trace.get_current_span()
    if target.is_recording():
        target.set_attributes(request_attributes(request_id, agent_id, query_type, layer))
