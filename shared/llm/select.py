"""The fleet a worker's settings declare, and a client for each of its backends.

`open_fleet`: the file LLM_FLEET names, else the seed variables as a one-backend fleet
(shared.llm.fleet), with the slots MODEL_MAIN / MODEL_CONVERSATIONAL, CLASSIFIER_LLM_CHAIN
and RELEVANCE_LLM_CHAIN (each `backend/model`, chains comma-separated) overriding the
file's. `open_clients`: Ollama's client for an `ollama` backend, the OpenAI protocol for
`openai`, llama.cpp's dialect of it for `local`. `open_backend` is the single client the
seed variables name, for callers that ask one server (the CLI's probes).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from shared.common.settings import CommonSettings, OpenAIServer
from shared.llm.circuit import CircuitBoard, KvCircuits
from shared.llm.fleet import (
    BackendKind,
    Fleet,
    FleetError,
    Slots,
    check_fleet,
    load_fleet,
    seed_fleet,
    url_problem,
)
from shared.llm.ollama import OllamaBackend
from shared.llm.openai import LlamaCppBackend, OpenAIBackend
from shared.llm.walk import Timing, Walker

Client = OllamaBackend | OpenAIBackend


def open_fleet(common: CommonSettings) -> Fleet:
    """The fleet the settings declare (checked: FleetError names the first problem)."""
    if common.llm_fleet:
        fleet = load_fleet(Path(common.llm_fleet))
    else:
        _check_seed_urls(common)
        fleet = seed_fleet({
            "ollama_host": common.ollama_host, "model_main": common.model_main,
            "model_conversational": common.model_conversational,
            "openai_base_url": common.openai_base_url, "openai_model": common.openai_model,
            "openai_model_conversational": common.openai_model_conversational,
            "openai_llamacpp": common.openai_server is OpenAIServer.LLAMACPP,
        })
    slots = fleet.slots
    fleet = msgspec.structs.replace(fleet, slots=Slots(
        main=common.slot_main or slots.main,
        conversational=common.slot_conversational or slots.conversational,
        classifier=_refs(common.classifier_llm_chain) or list(slots.classifier),
        relevance=_refs(common.relevance_llm_chain) or list(slots.relevance)))
    check_fleet(fleet)
    return fleet


def _check_seed_urls(common: CommonSettings) -> None:
    """The seed variables' URLs, named by their variable (FleetError)."""
    for variable, url, kind in (("OLLAMA_HOST", common.ollama_host, BackendKind.OLLAMA),
                                ("OPENAI_BASE_URL", common.openai_base_url,
                                 BackendKind.OPENAI)):
        problem = url_problem(kind, url) if url else ""
        if problem:
            raise FleetError(f"{variable}: {problem}")


def _refs(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def open_clients(fleet: Fleet, *, timeout: float,
                 environ: Mapping[str, str] | None = None) -> dict[str, Client]:
    """One client per backend; keys read from their references now, in `environ`
    (default: the process's)."""
    environ = os.environ if environ is None else environ
    clients: dict[str, Client] = {}
    for name, spec in fleet.backends.items():
        if spec.kind is BackendKind.OLLAMA:
            clients[name] = OllamaBackend(spec.url, timeout=timeout, name=name)
        else:
            dialect = LlamaCppBackend if spec.kind is BackendKind.LOCAL else OpenAIBackend
            clients[name] = dialect(spec.url, api_key=spec.api_key(environ),
                                    timeout=timeout, name=name)
    return clients


async def close_clients(clients: dict[str, Client]) -> None:
    for client in clients.values():
        close = getattr(client, "aclose", None)
        if close is not None:
            await close()


def default_backend(fleet: Fleet, common: CommonSettings) -> str:
    """The backend a model named without one runs on: the main slot's, else the seed
    variables' (Ollama first), else the fleet's first."""
    if fleet.slots.main:
        return fleet.slots.main.partition("/")[0]
    for name, spec in fleet.backends.items():
        if (spec.kind is BackendKind.OLLAMA) == (common.llm_backend == "ollama"):
            return name
    return next(iter(fleet.backends), "")


def label_chain(fleet: Fleet, common: CommonSettings, role: str, model: str) -> list[str]:
    """A label role's chain (`classifier` or `relevance`): the fleet's slot for it, else
    its one model (CLASSIFIER_LLM_MODEL, RELEVANCE_LLM_MODEL) on the default backend."""
    refs = list(getattr(fleet.slots, role))
    if refs:
        return refs
    if not model:
        return []
    if "/" in model and model.partition("/")[0] in fleet.backends:
        return [model]
    backend = default_backend(fleet, common)
    return [f"{backend}/{model}"] if backend else []


def timing_of(common: CommonSettings) -> Timing:
    """The global latency targets (LLM_FIRST_BYTE_MS, LLM_TTFT_MS, LLM_STALL_MS)."""
    return Timing(first_byte=common.llm_first_byte_ms / 1000,
                  ttft=common.llm_ttft_ms / 1000, stall=common.llm_stall_ms / 1000)


def open_walker(common: CommonSettings, nc: Any, *, timeout: float,
                fleet: Fleet | None = None) -> tuple[Walker, Callable[[], Awaitable[None]]]:
    """The walker of `fleet` (default: the settings'), with its clients and the shared
    circuits on `nc`'s JetStream when given; and how to close its clients."""
    fleet = open_fleet(common) if fleet is None else fleet
    # The seed fleet's key is OPENAI_API_KEY: the settings' value (a worker's settings
    # may come from a mapping, not the process's environment).
    environ = {**os.environ, "OPENAI_API_KEY": common.openai_api_key}
    clients = open_clients(fleet, timeout=timeout, environ=environ)
    board = None
    if nc is not None and fleet.backends:
        board = CircuitBoard(KvCircuits(nc.jetstream()),
                             threshold=common.llm_circuit_failures,
                             cooldown=common.llm_circuit_cooldown)
    async def close() -> None:
        await close_clients(clients)

    return Walker(fleet, clients, board, timing=timing_of(common)), close


def open_backend(common: CommonSettings, kind: str | None = None, *,
                 timeout: float) -> OllamaBackend | OpenAIBackend | None:
    """The `kind` backend of the seed variables ("ollama" | "openai"; default:
    `common.llm_backend`), None when its server is not configured."""
    kind = common.llm_backend if kind is None else kind
    if kind == "ollama" and common.ollama_host:
        return OllamaBackend(common.ollama_host, timeout=timeout)
    if kind == "openai" and common.openai_base_url:
        dialect = (LlamaCppBackend if common.openai_server is OpenAIServer.LLAMACPP
                   else OpenAIBackend)
        return dialect(common.openai_base_url, api_key=common.openai_api_key,
                       timeout=timeout)
    return None


__all__ = ["Client", "FleetError", "close_clients", "default_backend", "label_chain",
           "open_backend", "open_clients", "open_fleet", "open_walker", "timing_of"]
