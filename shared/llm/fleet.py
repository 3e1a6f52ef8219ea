"""The model fleet, declared once: backends (model servers) and the models each serves.

A model is named `backend/model` everywhere one is named (slots, chains, prices, the
request log, `answered_by`): the backend is the part before the first `/` (model names
may hold `/` themselves, `meta-llama/Llama-3`). A backend has a kind — `ollama`, `openai`
(any OpenAI-compatible server), `local` (the bundled llama.cpp server of `up --llm`) — a
URL, a key given by reference (`env:NAME` or `file:/path`, never the key itself), and per
model what it can do: its context length (0: not said) and whether it continues an
assistant prefill (an answer cut mid-stream is then continued, not restarted).

Where it comes from (`fleet_from_settings`): the file LLM_FLEET names (TOML), else the
seed variables as a one-backend fleet: OLLAMA_HOST (+ OLLAMA_MODEL_NAME,
OLLAMA_MODEL_NAME_CONVERSATIONAL) is backend `ollama`; OPENAI_BASE_URL (+ OPENAI_MODEL,
OPENAI_MODEL_CONVERSATIONAL, OPENAI_API_KEY) is backend `openai`, or `local` when
OPENAI_SERVER=llamacpp. A fleet file:

    [backends.local]
    kind = "local"
    url = "http://127.0.0.1:8081/v1"
    key = "env:OPENAI_API_KEY"
    [backends.local.models."smollm2-135m-instruct"]
    context = 8192
    prefill = true

    [backends.cloud]
    kind = "openai"
    url = "https://api.example.com/v1"
    key = "file:/run/secrets/cloud-key"
    models = { "big-1" = { context = 128000, prefill = false } }

    [slots]
    main = "cloud/big-1"
    conversational = "local/smollm2-135m-instruct"
    classifier = ["local/smollm2-135m-instruct"]   # Layer 3's own chain
    relevance = ["local/smollm2-135m-instruct"]    # the relevance judge's

Pure: reading the file and the key references is the only I/O (`load_fleet`,
`BackendSpec.api_key`), done once at a worker's start.
"""

from __future__ import annotations

import enum
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec

from shared.common.envvars import SettingError
from shared.policy import chain


class FleetError(SettingError):
    """A fleet declaration that cannot be used: the message says what to change (a
    setting's error: one line and exit 2, before any worker starts)."""


class BackendKind(enum.StrEnum):
    OLLAMA = "ollama"
    OPENAI = "openai"  # any OpenAI-compatible server
    LOCAL = "local"  # the bundled llama.cpp server (OpenAI protocol, its own grammar)


class ModelSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    # Tokens of context (0: not declared): a context-length refusal moves on only to a
    # step with a larger one.
    context: int = 0
    # Continues an assistant prefill: a cut answer is continued from what was sent.
    prefill: bool = False


class BackendSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    kind: BackendKind
    url: str
    models: dict[str, ModelSpec] = {}
    # `env:NAME` or `file:/path` ("": no key).
    key: str = ""

    def api_key(self, environ: Mapping[str, str] | None = None) -> str:
        """The key the reference names (read when a client is made, never stored)."""
        return resolve_secret(self.key, os.environ if environ is None else environ)


class Slots(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    main: str = ""
    conversational: str = ""
    classifier: list[str] = []
    relevance: list[str] = []


class Fleet(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    backends: dict[str, BackendSpec] = {}
    slots: Slots = Slots()

    def spec(self, ref: str) -> tuple[str, BackendSpec, str, ModelSpec]:
        """(backend name, its spec, model name, the model's spec) of `backend/model`;
        FleetError when the fleet has no such backend or model."""
        backend, model = split_ref(ref)
        found = self.backends.get(backend)
        if found is None:
            raise FleetError(f"{ref!r}: no backend {backend!r} in the fleet "
                             f"({', '.join(sorted(self.backends)) or 'none declared'})")
        if model not in found.models:
            raise FleetError(f"{ref!r}: backend {backend!r} serves no model {model!r} "
                             f"({', '.join(sorted(found.models)) or 'none declared'})")
        return backend, found, model, found.models[model]

    def has(self, ref: str) -> bool:
        try:
            self.spec(ref)
        except FleetError:
            return False
        return True

    def refs(self) -> list[str]:
        """Every model of the fleet, `backend/model`, in declaration order."""
        return [f"{name}/{model}" for name, spec in self.backends.items()
                for model in spec.models]

    @property
    def empty(self) -> bool:
        return not self.backends

    def slot_model(self, slot: str) -> str:
        """The slot's model (`main`, `conversational`: falls back to main), "" if none."""
        if slot == "conversational":
            return self.slots.conversational or self.slots.main
        return self.slots.main


def split_ref(ref: str) -> tuple[str, str]:
    """`backend/model` -> (backend, model); FleetError when it is not one."""
    try:
        return chain.split_ref(ref)
    except chain.ChainError as exc:
        raise FleetError(str(exc)) from exc


def resolve_secret(reference: str, environ: Mapping[str, str]) -> str:
    if not reference:
        return ""
    how, _, where = reference.partition(":")
    if how == "env":
        return environ.get(where, "")
    if how == "file":
        try:
            return Path(where).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise FleetError(f"key {reference!r}: {exc.strerror or exc}") from exc
    raise FleetError("a backend's key is given by reference: env:NAME or file:/path")


def url_problem(kind: BackendKind, url: str) -> str:
    """Why `url` cannot reach a `kind` server ("" when it can): a scheme and a host, and
    for the OpenAI protocol the `/v1` its paths hang from."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r} is not an http(s) URL with a host (e.g. http://127.0.0.1:11434)"
    try:
        parts.port  # noqa: B018 (validates it)
    except ValueError:
        return f"{url!r}: the port is not a number"
    if kind is not BackendKind.OLLAMA and not parts.path.rstrip("/").endswith("/v1"):
        return (f"{url!r}: an OpenAI-compatible base URL ends in /v1 "
                f"(e.g. {parts.scheme}://{parts.netloc}/v1)")
    return ""


def check_fleet(fleet: Fleet) -> None:
    """Every backend reachable in form and every slot naming a fleet model; FleetError
    naming the first problem."""
    for name, spec in fleet.backends.items():
        if not name or "/" in name:
            raise FleetError(f"backend name {name!r}: a name without '/'")
        problem = url_problem(spec.kind, spec.url)
        if problem:
            raise FleetError(f"backend {name!r}: {problem}")
        if spec.key:
            how = spec.key.partition(":")[0]
            if how not in ("env", "file"):
                raise FleetError(f"backend {name!r}: the key is given by reference "
                                 "(env:NAME or file:/path), never in the file")
    named = [fleet.slots.main, fleet.slots.conversational, *fleet.slots.classifier,
             *fleet.slots.relevance]
    for ref in named:
        if ref:
            fleet.spec(ref)


def load_fleet(path: Path) -> Fleet:
    """The fleet a TOML file declares (checked)."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise FleetError(f"LLM_FLEET {str(path)!r}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise FleetError(f"LLM_FLEET {str(path)!r}: not TOML: {exc}") from exc
    try:
        fleet = msgspec.convert(raw, Fleet)
    except msgspec.ValidationError as exc:
        raise FleetError(f"LLM_FLEET {str(path)!r}: {exc}") from exc
    check_fleet(fleet)
    return fleet


def seed_fleet(seed: Mapping[str, Any]) -> Fleet:
    """The one-backend fleet of the seed variables (module doc). `seed` holds
    `ollama_host`, `model_main`, `model_conversational`, `openai_base_url`,
    `openai_model`, `openai_model_conversational`, `openai_llamacpp` (bool)."""
    backends: dict[str, BackendSpec] = {}
    slots = Slots()
    main, conv = seed.get("model_main", ""), seed.get("model_conversational", "")
    if seed.get("ollama_host"):
        models = {m: ModelSpec(prefill=True) for m in (main, conv) if m}
        backends["ollama"] = BackendSpec(kind=BackendKind.OLLAMA, url=seed["ollama_host"],
                                         models=models)
        slots = Slots(main=f"ollama/{main}" if main else "",
                      conversational=f"ollama/{conv}" if conv else "")
    if seed.get("openai_base_url"):
        name = "local" if seed.get("openai_llamacpp") else "openai"
        kind = BackendKind.LOCAL if name == "local" else BackendKind.OPENAI
        omain = seed.get("openai_model") or main
        oconv = (seed.get("openai_model_conversational") or seed.get("openai_model")
                 or conv or main)
        models = {m: ModelSpec(prefill=kind is BackendKind.LOCAL) for m in (omain, oconv) if m}
        backends[name] = BackendSpec(kind=kind, url=seed["openai_base_url"], models=models,
                                     key="env:OPENAI_API_KEY")
        if not slots.main:
            slots = Slots(main=f"{name}/{omain}" if omain else "",
                          conversational=f"{name}/{oconv}" if oconv else "")
    return Fleet(backends=backends, slots=slots)
