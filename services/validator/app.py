"""Validator worker: settings -> stage -> lifespan (parser client, breaker)."""

from __future__ import annotations

from faststream import FastStream
from opentelemetry.trace import TracerProvider

from services.validator.handlers import CodeChecker, Unvalidated, ValidatorDeps, build_stage
from services.validator.settings import ValidatorSettings
from shared.bus import Bus
from shared.runtime import build_app
from shared.store.stores import Store
from shared.telemetry import build_tracer_provider, tracer_for


def build_checker(settings: ValidatorSettings) -> CodeChecker:
    # AVAP_PARSER_TIMEOUT=0 disables validation: no parser call at all (ADR-0009).
    if not settings.parser_url or settings.parser_timeout <= 0:
        return Unvalidated()
    from services.validator.checker import ParserChecker

    return ParserChecker.from_settings(settings)


def create_app(
    settings: ValidatorSettings | None = None,
    *,
    checker: CodeChecker | None = None,
    tracer_provider: TracerProvider | None = None,
) -> FastStream:
    settings = settings or ValidatorSettings.from_env()
    provider = tracer_provider or build_tracer_provider(
        "intentroute-validator", settings.common.otlp_endpoint
    )
    tracer = tracer_for("intentroute.validator", provider)

    async def make_deps(bus: Bus) -> ValidatorDeps:
        from services.validator.extract import extract_avap_code

        store = await Store.connect(settings.common.database_url, tracer=tracer)
        return ValidatorDeps(bus, store, checker or build_checker(settings), extract_avap_code)

    return build_app(
        common=settings.common,
        stages=[build_stage(settings)],
        make_deps=make_deps,
        tracer_provider=provider,
    )
