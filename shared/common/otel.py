"""OpenTelemetry's standard settings as the workers read them (`CommonSettings.otel`,
variables OTEL_*), and the attributes every span of a request carries.

Only what picks the exporters is read here: whether the SDK is on, the service's name,
the exporters of each signal and the OTLP protocol, and whether an OTLP endpoint is set
at all. Everything else of the specification (endpoints, headers, timeouts, compression,
certificates, OTEL_TRACES_SAMPLER and _ARG, OTEL_RESOURCE_ATTRIBUTES,
OTEL_METRIC_EXPORT_INTERVAL, OTEL_BSP_*) the SDK and its exporters read from the
process environment themselves (shared.runtime.telemetry builds them).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

# The attributes of a request's spans (the door's, each stage's, the store writes', the
# parser call's): who asked what, and how it was routed.
REQUEST_ID = "intentroute.request_id"
AGENT_ID = "intentroute.agent_id"
QUERY_TYPE = "intentroute.query_type"
LAYER = "intentroute.layer"

Attributes = dict[str, str]

# The Prometheus exporter's port (OTEL_EXPORTER_PROMETHEUS_PORT's default): a worker's
# when OTEL_METRICS_EXPORTER names prometheus and METRICS_PORT is unset, the first one
# `intentroute up` tries for its workers.
PROMETHEUS_PORT = 9464


def request_attributes(request_id: str = "", agent_id: str = "", query_type: str = "",
                       layer: str = "") -> Attributes:
    """The span attributes of a request, those not known (empty) left out."""
    pairs = ((REQUEST_ID, request_id), (AGENT_ID, agent_id), (QUERY_TYPE, query_type),
             (LAYER, layer))
    return {key: value for key, value in pairs if value}


class OtelSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Read by `CommonSettings` (env_group); the fields as the specification names them."""

    # OTEL_SDK_DISABLED=true: no traces, no metrics, whatever else is set.
    sdk_disabled: bool = False
    # OTEL_SERVICE_NAME; "": the worker's own name (intentroute-<worker>).
    service_name: str = ""
    # OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER: comma-separated names (otlp, console,
    # none, prometheus for metrics, or any installed exporter's entry point). "": traces
    # go to OTLP when an OTLP endpoint is set, else nowhere; metrics to Prometheus when
    # METRICS_PORT is set and to OTLP when an OTLP endpoint is set (a worker with no
    # collector logs no failed exports).
    traces_exporter: str = ""
    metrics_exporter: str = ""
    # grpc (default) or http/protobuf, for both signals unless the signal's own is set.
    protocol: str = ""
    traces_protocol: str = ""
    metrics_protocol: str = ""
    # Only whether they are set is read here (the exporters read their values).
    endpoint: str = ""
    traces_endpoint: str = ""
    metrics_endpoint: str = ""

    def traces_exporters(self) -> list[str]:
        default = ["otlp"] if self.endpoint or self.traces_endpoint else []
        return self._chosen(self.traces_exporter, default)

    def metrics_exporters(self, prometheus_port: int) -> list[str]:
        """`prometheus_port`: METRICS_PORT (0: unset)."""
        default = ["prometheus"] if prometheus_port else []
        if self.endpoint or self.metrics_endpoint:
            default.append("otlp")
        return self._chosen(self.metrics_exporter, default)

    def _chosen(self, names: str, default: list[str]) -> list[str]:
        if self.sdk_disabled:
            return []
        chosen = _names(names.split(",")) if names.strip() else default
        return [] if "none" in chosen else chosen


def _names(parts: Iterable[str]) -> list[str]:
    """Each name once, in order, lower-cased and stripped."""
    seen: dict[str, None] = {}
    for part in parts:
        name = part.strip().lower()
        if name:
            seen.setdefault(name)
    return list(seen)
