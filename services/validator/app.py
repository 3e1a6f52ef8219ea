"""Validator worker: settings -> broker -> router -> lifespan (parser client, breaker)."""

from __future__ import annotations

from faststream import FastStream
from faststream.nats import NatsBroker
from opentelemetry.trace import TracerProvider

from services.validator.handlers import CodeChecker, Unvalidated, ValidatorDeps, build_router
from services.validator.settings import ValidatorSettings
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

    async def make_deps(broker: NatsBroker) -> ValidatorDeps:
        from services.validator.extract import extract_avap_code

        store = await Store.connect(settings.common.database_url, tracer=tracer)
        return ValidatorDeps(store, checker or build_checker(settings), extract_avap_code)

    return build_app(
        common=settings.common,
        routers=[build_router(settings)],
        make_deps=make_deps,
        tracer_provider=provider,
    )
