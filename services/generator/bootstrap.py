"""The generator's composition root in small steps (as cosmicpython's bootstrap): the
slot's model backend, chosen from the settings, and the one probe that says at start why
a misconfigured OpenAI-compatible server will not answer. `app.py` calls them."""

from __future__ import annotations

import asyncio
import logging

from services.generator.backends import EchoBackend, OpenAIBackend, ProbeFailure
from services.generator.health import BackendHealth
from services.generator.ports import ChatBackend
from services.generator.settings import GeneratorSettings
from shared.llm.select import open_backend

log = logging.getLogger("intentroute.generator")


def choose_backend(settings: GeneratorSettings) -> ChatBackend | None:
    """None means the extractive answerer answers on its own."""
    kind = settings.backend_kind
    if kind == "echo":
        return EchoBackend(settings.echo_delay)
    if kind in ("ollama", "openai"):
        return open_backend(settings.common, kind, timeout=settings.ollama_timeout)
    return None


async def report_probe(backend: OpenAIBackend, *, tries: int = 30, pause: float = 1.0,
                       health: BackendHealth | None = None) -> ProbeFailure | None:
    """A wrong URL or key fails every call, each answer falling back to the extractive
    answerer: say why once, at start, in one warning line (not fatal), and in `health`
    (`intentroute status`). A server not listening yet (`up --llm` starts it beside the
    workers) is asked again meanwhile."""
    problem = await backend.probe()
    for _ in range(tries - 1):
        if problem is None or problem.status is not None:
            break
        await asyncio.sleep(pause)
        problem = await backend.probe()
    if health is not None:
        health.probe(problem.reason if problem else None)
    if problem:
        log.warning("openai backend: %s; answers fall back to the extractive answerer "
                    "(check OPENAI_BASE_URL, /v1 included, and OPENAI_API_KEY)",
                    problem.reason)
    return problem
