"""The generator's view of the fleet: a walker over the fleet the settings declare
(shared.llm.select), the echo backend of the benchmarks, the start-up probes and the
circuits' refresh for `intentroute status`.

A backend's stream yields the answer's text pieces and, at most once and last, the
token counts the model server reported for the call (`TokenCounts`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import msgspec
from nats.aio.client import Client

from services.generator.health import FleetHealth
from services.generator.settings import GeneratorSettings
from shared.common.tasks import cancel_and_wait
from shared.llm.fleet import BackendKind, BackendSpec, Fleet, ModelSpec, Slots
from shared.llm.ollama import OllamaBackend
from shared.llm.openai import OpenAIBackend
from shared.llm.ports import ChatMessage, Ended, Started, StreamEvent
from shared.llm.select import open_fleet, timing_of
from shared.llm.select import open_walker as shared_walker
from shared.llm.walk import Walker

log = logging.getLogger("intentroute.generator")

ECHO = "echo"


class EchoBackend:
    """Backend of the benchmarks: repeats the query, at once or (`delay` seconds) in
    four pieces spread over that time, like a model's stream."""

    name = ECHO

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    async def stream(self, model: str, messages: list[ChatMessage], *,
                     prefill: str = "") -> AsyncIterator[StreamEvent]:
        text = messages[-1].content
        yield Started()
        if self.delay <= 0:
            yield text
        else:
            step = max(1, len(text) // 4)
            for start in range(0, len(text), step):
                await asyncio.sleep(self.delay / 4)
                yield text[start:start + step]
        yield Ended(marked=True, finish_reason="stop")


def echo_fleet() -> Fleet:
    spec = BackendSpec(kind=BackendKind.LOCAL, url="http://echo.invalid/v1",
                       models={ECHO: ModelSpec()})
    return Fleet(backends={ECHO: spec}, slots=Slots(main=f"{ECHO}/{ECHO}"))


def settings_fleet(settings: GeneratorSettings) -> Fleet:
    """The fleet of the settings. Without LLM_FLEET, GENERATOR_BACKEND=ollama|openai
    puts the slots on that seed backend (both may be configured); `extractive`: none."""
    common = settings.common
    if settings.backend == "extractive":
        return Fleet()
    fleet = open_fleet(common)
    if settings.backend not in ("ollama", "openai") or common.llm_fleet:
        return fleet
    want_ollama = settings.backend == "ollama"
    name = next((n for n, b in fleet.backends.items()
                 if (b.kind is BackendKind.OLLAMA) == want_ollama), "")
    if not name:
        return Fleet()
    main = common.slot_model(settings.backend, conversational=False)
    conv = common.slot_model(settings.backend, conversational=True)
    return msgspec.structs.replace(fleet, slots=Slots(
        main=f"{name}/{main}" if main else "", conversational=f"{name}/{conv}" if conv else ""))


def open_walker(settings: GeneratorSettings, nc: Client | None
                ) -> tuple[Walker, str, Callable[[], Awaitable[None]]]:
    """(the walker, the slot's model, how to close its clients)."""
    if settings.backend == ECHO:
        fleet = echo_fleet()

        async def nothing() -> None:
            return None

        walker = Walker(fleet, {ECHO: EchoBackend(settings.echo_delay)},
                        timing=timing_of(settings.common))
        return walker, fleet.slot_model(settings.slot.value), nothing
    fleet = settings_fleet(settings)
    walker, close = shared_walker(settings.common, nc, timeout=settings.ollama_timeout,
                                  fleet=fleet)
    return walker, fleet.slot_model(settings.slot.value), close


class Background:
    """A worker's background loop; `stop` ends it."""

    def __init__(self, run: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
        self._task: asyncio.Task[None] = asyncio.create_task(run(), name=name)

    async def stop(self) -> None:
        await cancel_and_wait(self._task)


def refresh_circuits(walker: Walker, health: FleetHealth, every: float = 2.0) -> Background:
    """The shared circuits' state for status and /metrics, read every `every` seconds."""

    async def run() -> None:
        if walker.board is None:
            return
        while True:
            health.circuits = await walker.board.snapshot(list(walker.fleet.backends))
            await asyncio.sleep(every)

    return Background(run, "circuit-refresh")


def report_probes(walker: Walker, health: FleetHealth, *, tries: int = 30,
                  pause: float = 1.0) -> Background:
    """Each OpenAI-compatible backend (`GET {base}/models`: a wrong URL or key shows
    without a token spent) and each Ollama one (`GET {host}/api/version`) asked once at
    start: a failure is one warning line naming the
    URL and what answers instead, and its models' state. A server not listening yet
    (`up --llm` starts it beside the workers) is asked again meanwhile."""

    async def probe(name: str, client: OpenAIBackend | OllamaBackend) -> None:
        problem = await client.probe()
        warned = False
        for _ in range(tries - 1):
            if problem is None or problem.status is not None:
                break
            if not warned:
                log.warning("backend %s: %s; its models' requests follow each agent's "
                            "chain (the extractive answerer by default) until it answers",
                            name, problem.reason)
                warned = True
            await asyncio.sleep(pause)
            problem = await client.probe()
        for ref in walker.fleet.refs():
            if ref.partition("/")[0] == name:
                health.probe(ref, problem.reason if problem else None)
        if problem and problem.status is not None:
            log.warning("backend %s: %s; answers follow each agent's chain (the "
                        "extractive answerer by default) (check its URL, /v1 included, "
                        "and its key)", name, problem.reason)

    async def run() -> None:
        await asyncio.gather(*(probe(name, client) for name, client in walker.clients.items()
                               if isinstance(client, OpenAIBackend | OllamaBackend)))

    return Background(run, "backend-probes")
