"""Learner worker: settings -> the learning job's loop -> its run counts on the services
API (`intentroute status`: one row, `learner`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from faststream import FastStream
from opentelemetry.trace import TracerProvider

from services.learner.settings import LearnerSettings
from shared.learning.job import LearnLoop
from shared.runtime.micro import Endpoint
from shared.runtime.signals import Outcome, StageStats
from shared.runtime.worker import ClientWiring, build_client_app

ENDPOINT = "learner"


def counting(stats: StageStats) -> Callable[[dict[str, Any]], None]:
    """A LearnLoop `on_run` that counts each run (its seconds, failed or not)."""
    def on_run(summary: dict[str, Any]) -> None:
        if summary.get("ran"):
            stats.record(Outcome.OK if summary.get("ok") else Outcome.ERROR,
                         float(summary.get("seconds", 0.0)))
    return on_run


def create_app(settings: LearnerSettings | None = None, *,
               tracer_provider: TracerProvider | None = None) -> FastStream:
    settings = settings or LearnerSettings.from_env()

    async def serve(wiring: ClientWiring) -> None:
        loop = LearnLoop(settings.database_url, settings.learn,
                         on_run=counting(wiring.signals.stage(ENDPOINT)))
        loop.start()
        wiring.exits.push_async_callback(loop.stop)

    return build_client_app(service="learner", common=settings.common, serve=serve,
                            endpoints=[Endpoint(ENDPOINT, f"every {settings.learn.interval:g} s",
                                                {"started": str(int(time.time()))})],
                            tracer_provider=tracer_provider)
