"""Validator worker: settings -> stage -> deps (parser client behind its breaker)."""

from __future__ import annotations

from faststream import FastStream
from opentelemetry.trace import TracerProvider

from services.validator.breaker import CircuitBreaker
from services.validator.handlers import ValidatorDeps, build_stage
from services.validator.parser_client import GrpcParserClient, GuardedParser
from services.validator.settings import ValidatorSettings
from shared.cache.offer import CacheWriter
from shared.runtime.worker import Wiring, build_app


def build_checker(settings: ValidatorSettings) -> GuardedParser:
    """The parser behind the breaker and the timeout. AVAP_PARSER_TIMEOUT=0 or no
    AVAP_PARSER_URL disables validation: no parser call at all (ADR-0009)."""
    client = None
    if settings.parser_url and settings.parser_timeout > 0:
        client = GrpcParserClient(settings.parser_url, timeout=settings.parser_timeout)
    return GuardedParser(client, CircuitBreaker(settings.cb_threshold, settings.cb_cooldown),
                         timeout=settings.parser_timeout, strict=settings.strict)


def create_app(
    settings: ValidatorSettings | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
) -> FastStream:
    settings = settings or ValidatorSettings.from_env()

    async def make_deps(wiring: Wiring) -> ValidatorDeps:
        guarded = build_checker(settings)
        wiring.base.exits.push_async_callback(guarded.close)
        if guarded.enabled:  # exported as intentroute_breaker_state{breaker="parser"}
            wiring.signals.watch_breaker("parser", lambda: guarded.breaker.state.value)
        answer_cache = CacheWriter(wiring.store.pool, settings.common)
        wiring.base.exits.push_async_callback(answer_cache.close)
        return ValidatorDeps(**wiring.base.parts(), checker=guarded, answer_cache=answer_cache)

    return build_app(service="validator", common=settings.common,
                     stages=[build_stage(settings)], make_deps=make_deps,
                     tracer_provider=tracer_provider)
