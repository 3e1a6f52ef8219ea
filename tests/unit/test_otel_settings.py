"""OpenTelemetry chosen by its standard variables: which exporters each signal gets, the
exporter classes the protocol picks, the resource's name, and `up`'s metrics ports."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

from intentroute.stack.tcp_ports import PortPlan, Wanted, plan_ports
from shared.common.otel import AGENT_ID, LAYER, QUERY_TYPE, REQUEST_ID, request_attributes
from shared.common.settings import CommonSettings, SettingError
from shared.runtime.telemetry import (
    build_tracer_provider,
    metric_reader_factories,
    worker_resource,
)


def otel(**environ: str):  # type: ignore[no-untyped-def]
    return CommonSettings.from_env(environ).otel


def test_traces_stay_off_until_an_endpoint_or_an_exporter_is_named() -> None:
    assert otel().traces_exporters() == []
    assert otel(OTEL_EXPORTER_OTLP_ENDPOINT="http://c:4317").traces_exporters() == ["otlp"]
    assert otel(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="http://c:4317").traces_exporters() == ["otlp"]
    # A metrics endpoint is not a traces one.
    assert otel(OTEL_EXPORTER_OTLP_METRICS_ENDPOINT="http://c:4317").traces_exporters() == []
    assert otel(OTEL_TRACES_EXPORTER="console, OTLP,console").traces_exporters() == [
        "console", "otlp"]
    assert otel(OTEL_TRACES_EXPORTER="none",
                OTEL_EXPORTER_OTLP_ENDPOINT="http://c:4317").traces_exporters() == []


def test_metrics_go_to_prometheus_with_a_port_and_to_otlp_with_an_endpoint() -> None:
    assert otel().metrics_exporters(0) == []
    assert otel().metrics_exporters(9464) == ["prometheus"]
    assert otel(OTEL_EXPORTER_OTLP_ENDPOINT="http://c:4317").metrics_exporters(9464) == [
        "prometheus", "otlp"]
    assert otel(OTEL_EXPORTER_OTLP_METRICS_ENDPOINT="http://c:4318/v1/metrics"
                ).metrics_exporters(0) == ["otlp"]
    # Named explicitly, the list is the list: no Prometheus although a port is set.
    assert otel(OTEL_METRICS_EXPORTER="otlp").metrics_exporters(9464) == ["otlp"]


def test_sdk_disabled_turns_every_signal_off() -> None:
    settings = otel(OTEL_SDK_DISABLED="true", OTEL_EXPORTER_OTLP_ENDPOINT="http://c:4317",
                    OTEL_TRACES_EXPORTER="console", OTEL_METRICS_EXPORTER="prometheus")
    assert settings.traces_exporters() == []
    assert settings.metrics_exporters(9464) == []
    assert build_tracer_provider("gateway", settings) is None


@pytest.mark.parametrize(("protocol", "module"), [
    ("", "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"),
    ("grpc", "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"),
    ("http/protobuf", "opentelemetry.exporter.otlp.proto.http.trace_exporter"),
])
def test_the_otlp_protocol_picks_the_exporter(protocol: str, module: str) -> None:
    provider = build_tracer_provider("gateway", otel(
        OTEL_EXPORTER_OTLP_PROTOCOL=protocol, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9"))
    assert provider is not None
    try:
        processors = provider._active_span_processor._span_processors
        assert [type(p.span_exporter).__module__ for p in processors] == [module]  # type: ignore[attr-defined]
    finally:
        provider.shutdown()


def test_a_signals_own_protocol_wins_over_the_common_one() -> None:
    settings = otel(OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                    OTEL_EXPORTER_OTLP_METRICS_PROTOCOL="http/protobuf",
                    OTEL_METRICS_EXPORTER="otlp,console")
    readers = [make() for make in metric_reader_factories(settings, settings.metrics_exporters(0))]
    try:
        assert all(isinstance(r, PeriodicExportingMetricReader) for r in readers)
        assert [type(r._exporter).__module__ for r in readers] == [
            "opentelemetry.exporter.otlp.proto.http.metric_exporter",
            "opentelemetry.sdk.metrics._internal.export"]
    finally:
        for reader in readers:
            reader.shutdown()


def test_a_mistaken_exporter_or_protocol_is_one_line_naming_the_variable() -> None:
    with pytest.raises(SettingError, match=r"^OTEL_TRACES_EXPORTER: no exporter 'jaegr' is "
                                           r"installed \(installed: .*console.*otlp"):
        build_tracer_provider("gateway", otel(OTEL_TRACES_EXPORTER="jaegr"))
    with pytest.raises(SettingError, match=r"^OTEL_EXPORTER_OTLP_PROTOCOL: expected grpc or "
                                           r"http/protobuf, got 'http/json'"):
        build_tracer_provider("gateway", otel(OTEL_EXPORTER_OTLP_PROTOCOL="http/json",
                                              OTEL_TRACES_EXPORTER="otlp"))


def test_the_sampler_is_the_sdks_own_reading_of_otel_traces_sampler(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    provider = build_tracer_provider("gateway", otel(OTEL_TRACES_EXPORTER="console"))
    assert provider is not None
    try:
        assert "TraceIdRatioBased{0.25}" in provider.sampler.get_description()
    finally:
        provider.shutdown()


def test_the_service_name_is_the_workers_unless_otel_service_name_says(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=staging")
    attributes = worker_resource("generator-main", otel()).attributes
    assert attributes["service.name"] == "intentroute-generator-main"
    assert attributes["deployment.environment"] == "staging"
    assert attributes["service.instance.id"]
    named = worker_resource("generator-main", otel(OTEL_SERVICE_NAME="assist")).attributes
    assert named["service.name"] == "assist"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-resource")
    assert worker_resource("gateway", otel()).attributes["service.name"] == "from-resource"


def test_request_attributes_leave_out_what_is_not_known() -> None:
    assert request_attributes("r1", "a1") == {REQUEST_ID: "r1", AGENT_ID: "a1"}
    assert request_attributes("r1", "a1", "RETRIEVAL", "embedding") == {
        REQUEST_ID: "r1", AGENT_ID: "a1", QUERY_TYPE: "RETRIEVAL", LAYER: "embedding"}


def test_up_plans_a_run_of_metrics_ports_from_9464_and_keeps_it(tmp_path: Path) -> None:
    taken: set[int] = set()
    free = iter(range(20000, 30000, 100))
    wanted = Wanted(nats_nodes=0, postgres=False, gateway_http=False, parser=False,
                    metrics=7)
    plan = plan_ports(tmp_path, wanted, is_free=lambda p: p not in taken,
                      pick=lambda: next(free))
    assert plan.ports.metrics == 9464
    plan.save()
    # Next time one port of the run is taken: the whole run moves, and the banner says so.
    taken.add(9470)
    moved = plan_ports(tmp_path, wanted, is_free=lambda p: p not in taken,
                       pick=lambda: next(free))
    assert moved.ports.metrics == 20000
    assert moved.moved == ["metrics 9464 -> 20000 (taken)"]
    moved.save()
    again = plan_ports(tmp_path, wanted, is_free=lambda p: p not in taken,
                       pick=lambda: next(free))
    assert again.ports.metrics == 20000
    assert "metrics 20000" in again.reused
    # METRICS_PORT given: as given.
    explicit = PortPlan(tmp_path, is_free=lambda p: True)
    assert explicit.block("metrics", 7, 9600, 20000, 9464) == 9600


def test_up_serves_prometheus_metrics_unless_told_otherwise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from intentroute.cli.stack_cmds import _metrics_wanted
    from intentroute.settings import CliSettings

    counts = {"gateway": 2, "classifier": 1}
    for name in ("METRICS_PORT", "OTEL_METRICS_EXPORTER", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    assert _metrics_wanted(CliSettings.from_env(), counts) == (3, None)
    monkeypatch.setenv("METRICS_PORT", "9700")
    assert _metrics_wanted(CliSettings.from_env(), counts) == (3, 9700)
    for variable, value in (("METRICS_PORT", "0"), ("OTEL_METRICS_EXPORTER", "otlp"),
                            ("OTEL_SDK_DISABLED", "true")):
        with monkeypatch.context() as patch:
            patch.setenv(variable, value)
            assert _metrics_wanted(CliSettings.from_env(), counts) == (0, None), variable
