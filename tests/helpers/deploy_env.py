"""What a deployed worker reads from its environment, for the compose and Kubernetes
checks: each worker's settings (the variables they declare, through
shared.common.settings' `env` declarations, and their values when unset), and the
variables a deployment may leave unset because empty means "off"."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, get_args, get_origin

import msgspec

from services.classifier.settings import ClassifierSettings
from services.doors.settings import DoorsSettings
from services.gateway.settings import GatewaySettings
from services.generator.settings import GeneratorSettings
from services.retriever.settings import RetrieverSettings
from services.validator.settings import ValidatorSettings
from shared.common.settings import Env, EnvGroup
from shared.contracts.routing import ModelSlot

# How `intentroute worker NAME` builds each worker's settings (intentroute/workers.py).
WORKER_SETTINGS: dict[str, Callable[[Mapping[str, str]], msgspec.Struct]] = {
    "gateway": GatewaySettings.from_env,
    "classifier": ClassifierSettings.from_env,
    "retriever": RetrieverSettings.from_env,
    "generator-main": lambda e: GeneratorSettings.from_env(e, slot=ModelSlot.MAIN),
    "generator-conversational": lambda e: GeneratorSettings.from_env(
        e, slot=ModelSlot.CONVERSATIONAL),
    "validator": ValidatorSettings.from_env,
    "doors": DoorsSettings.from_env,
}

# Read by `intentroute worker` itself (intentroute/settings.py), not by the worker's
# settings: the file holding DATABASE_URL's password.
WORKER_COMMAND = {"DATABASE_PASSWORD_FILE"}
# Read by libraries or the platform, not by a settings class.
NOT_SETTINGS = {"HOME", "HF_HUB_OFFLINE", "PG_ADDRESS"}

# The credential `intentroute worker` finds in INTENTROUTE_HOME/creds (its service
# user's file and admission.key) becomes these (intentroute.stack.nats_users.service_env).
FROM_CREDENTIAL = {"NATS_USER", "NATS_PASSWORD", "NATS_INBOX_PREFIX",
                   "INTENTROUTE_ADMISSION_KEY"}

# Unset in a deployment on purpose: empty (or none) means off or "the default".
OFF: dict[str, str] = {
    "ES_URL": "the embedded index (a shared volume) instead of Elasticsearch",
    "OPENAI_BASE_URL": "Ollama serves the models",
    "OPENAI_MODEL": "Ollama serves the models",
    "OPENAI_MODEL_CONVERSATIONAL": "Ollama serves the models",
    "OPENAI_API_KEY": "Ollama serves the models",
    "LLM_FLEET": "the seed variables (OLLAMA_HOST, ...) are the fleet: one backend",
    "MODEL_MAIN": "the slot's model from the seed variables (OLLAMA_MODEL_NAME)",
    "MODEL_CONVERSATIONAL": "the slot's model from the seed variables",
    "CLASSIFIER_LLM_CHAIN": "Layer 3 on CLASSIFIER_LLM_MODEL of the default backend",
    "RELEVANCE_LLM_CHAIN": "the judge on RELEVANCE_LLM_MODEL of the default backend",
    "NATS_TOKEN": "user + password instead",
    "NATS_CREDS": "user + password instead",
    "NATS_TLS_CA": "NATS without TLS inside the deployment's network",
    "NATS_TLS_CERT": "NATS without TLS inside the deployment's network",
    "NATS_TLS_KEY": "NATS without TLS inside the deployment's network",
    "GATEWAY_TLS_CERT": "TLS ends at a proxy or ingress in front of the doors",
    "GATEWAY_TLS_KEY": "TLS ends at a proxy or ingress in front of the doors",
    "CLASSIFIER_HEADS_DIR": "the shipped head, seeded into INTENTROUTE_HOME/heads",
    "OTEL_SERVICE_NAME": "defaults to the worker's name",
    "OTEL_TRACES_EXPORTER": "the OTEL_* standard defaults",
    "OTEL_METRICS_EXPORTER": "the OTEL_* standard defaults",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "the OTEL_* standard defaults",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "the OTEL_* standard defaults",
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "the OTEL_* standard defaults",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "no collector unless one is added",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "no collector unless one is added",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "no collector unless one is added",
    "OTEL_SDK_DISABLED": "the OTEL_* standard defaults",
    **{f"LIMIT_{name}": "no deployment-wide limit: each agent's policy (`agent set`)"
       for name in ("RATE", "BURST", "MAX_INFLIGHT", "TOKENS_PER_MIN", "BUDGET_DAY",
                    "BUDGET_MONTH")},
}


# Unset on purpose for one worker only.
OFF_FOR: dict[str, dict[str, str]] = {
    "doors": {"INTENTROUTE_ADMISSION_KEY": "the doors stamp no envelope: they publish on "
                                           "agents' subjects, which the gateway admits",
              "GATEWAY_DASHBOARD_LOGIN_LINKS": "one-time login links are minted by "
                                               "`intentroute up` on its own machine; a "
                                               "deployment's dashboard signs in with a token"},
}


def declared_values(settings: msgspec.Struct) -> dict[str, Any]:
    """Variable -> the value it gave `settings` (nested settings included)."""
    out: dict[str, Any] = {}
    for field in msgspec.structs.fields(type(settings)):
        value = getattr(settings, field.name)
        declared = _declaration(field.type)
        if isinstance(declared, Env):
            out[declared.name] = value
        elif isinstance(declared, EnvGroup):
            out.update({name: getattr(value, sub) for sub, name in declared.names})
        elif isinstance(value, msgspec.Struct):
            out.update(declared_values(value))
    return out


def _declaration(annotation: Any) -> Env | EnvGroup | None:
    if get_origin(annotation) is not Annotated:
        return None
    found = [m for m in get_args(annotation)[1:] if isinstance(m, Env | EnvGroup)]
    return found[0] if found else None


def reads(worker: str) -> set[str]:
    """Every variable `intentroute worker NAME` reads for this worker."""
    return set(declared_values(WORKER_SETTINGS[worker]({}))) | WORKER_COMMAND


def environment_problems(worker: str, environ: Mapping[str, str]) -> list[str]:
    """What is wrong with the environment a deployment gives `worker`: a variable it
    sets that the worker does not read (a typo, a retired name), or one the worker reads
    that is still empty (no default, nothing derived from another) and is neither set
    nor off on purpose (OFF). The worker's settings are built from `environ` too: a
    value they refuse raises SettingError."""
    known = reads(worker) | NOT_SETTINGS
    problems = [f"{worker}: {name} is set but no setting of this worker reads it"
                for name in sorted(set(environ) - known)]
    values = declared_values(WORKER_SETTINGS[worker](environ))
    empty = {name for name, value in values.items() if value in ("", None)}
    problems += [f"{worker}: {name} has no default and is not set"
                 for name in sorted(empty - set(environ) - set(OFF)
                                    - set(OFF_FOR.get(worker, {})))]
    return problems
