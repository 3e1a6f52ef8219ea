"""The commands of the side processes `up` supervises beside the workers: the reference
AVAP parser service and the local model server. Each sets in the workers' env where it
will listen."""

from __future__ import annotations

import sys
from collections.abc import Mapping

from intentroute.stack.procs import free_port


def runs_parser(env: Mapping[str, str]) -> bool:
    """Whether `up` runs the parser: not when AVAP_PARSER_URL points elsewhere or
    validation is off."""
    return not (env.get("AVAP_PARSER_URL")
                or env.get("AVAP_PARSER_TIMEOUT", "").strip() in ("0", "0.0"))


def parser_argv(env: dict[str, str], port: int = 0) -> list[str]:
    """The reference AVAP parser service's command (it listens on `port`, else one
    chosen here, which the workers' env names), unless it runs elsewhere."""
    if not runs_parser(env):
        return []
    port = port or free_port()
    env["AVAP_PARSER_URL"] = f"127.0.0.1:{port}"
    return [sys.executable, "-m", "intentroute.cli", "parser", "--port", str(port)]


def llm_argv(env: dict[str, str], port: int = 0) -> list[str]:
    """The local model server's command; the generators' env points at it (its API key
    travels in the env, never on a command line)."""
    from intentroute.stack.llm import LOCAL_MODEL, local_model_path, new_api_key, server_env

    local_model_path()  # a missing model is an error now, not a restart loop later
    port = port or free_port()
    env.update(server_env(port, new_api_key()))
    env.setdefault("OLLAMA_MODEL_NAME", LOCAL_MODEL)
    # Layer 3 stays off on it unless asked for (CLASSIFIER_LLM_MODEL=smollm2-135m-instruct):
    # on the messages Layer 2 was unsure of in the blind and fresh routing sets,
    # SmolLM2-135M's labels were right 0 times in 5, Layer 2's own guess 4 times.
    env.setdefault("CLASSIFIER_LLM_MODEL", "")
    return [sys.executable, "-m", "intentroute.cli", "llm-server", "--port", str(port)]
