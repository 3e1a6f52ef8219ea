"""A worker's logs: one handler on stderr, as text or one JSON object per line, with the
worker's name and, while a message is handled, its request and agent; libraries quiet.

* `configure_logging` (called by `shared.runtime.worker.build_app`, and by `up`) installs
  the handler on the root logger, at `LOG_LEVEL`, formatted as `LOG_FORMAT` says;
* `log_context` (set by the stage template, `shared.runtime.stage.run_stage`, around each
  message) puts `request_id` and `agent_id` on every record logged inside it;
* `quiet_libraries` silences what third-party code prints on a start: every library's
  INFO lines (onnxruntime's quantization and graph fusions among them), the warnings
  that ask for nothing (onnxruntime's quantizer's advice, platformdirs' runtime-directory
  warning), and progress bars (tqdm, Hugging Face) when stderr is not a terminal.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from types import MappingProxyType
from typing import IO

from shared.common.settings import LogFormat

# Fields of the message being handled (request_id, agent_id), for every record logged.
LOG_CONTEXT: ContextVar[Mapping[str, str]] = ContextVar(
    "intentroute_log_context", default=MappingProxyType({}))
# The per-message fields a record may carry, in the order JSON lines show them.
CONTEXT_FIELDS = ("request_id", "agent_id")
# Libraries whose INFO lines say nothing a person running the stack can act on.
_NOISY = ("onnxruntime", "faststream", "transformers", "sentence_transformers",
          "huggingface_hub", "httpx", "urllib3", "filelock",
          # 12 plugin lines and a multi-line one per revision on each `up`; what a
          # migration applied is one line of `shared.store.migrate`'s.
          "alembic")
_TEXT = "%(asctime)s %(levelname)s %(worker)s %(name)s %(message)s"


@contextmanager
def log_context(**fields: str) -> Iterator[None]:
    """Records logged inside carry `fields` (those that are empty are left out)."""
    token = LOG_CONTEXT.set({**LOG_CONTEXT.get(), **{k: v for k, v in fields.items() if v}})
    try:
        yield
    finally:
        LOG_CONTEXT.reset(token)


class ContextFilter(logging.Filter):
    """Puts the worker's name and the handled message's fields on each record."""

    def __init__(self, worker: str) -> None:
        super().__init__()
        self.worker = worker

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "worker"):
            record.worker = self.worker
        for key, value in LOG_CONTEXT.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


# The project's own loggers (`intentroute.*`, and those named after a module): kept at
# every level wherever the code is installed.
_OWN = ("intentroute", "services", "shared", "bench", "offline", "testkit")
# Warnings a library prints that ask nothing of the person running the stack.
_NO_ACTION = (
    # onnxruntime's quantizer, on every int8 graph built (the graph is built from the
    # project's own calibrated export: there is nothing to pre-process).
    "Please consider to run pre-processing before quantization",
)


class LibraryNoiseFilter(logging.Filter):
    """Drops INFO and DEBUG records of third-party code (on the root logger, as
    onnxruntime's quantizer logs a line per tensor, or on a logger of its own, as
    onnxruntime.transformers' `fusion_base`, `onnx_model` ... log the graph fusions
    under their bare module names), and the library warnings that ask for nothing
    (`_NO_ACTION`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        own = record.name.split(".", 1)[0] in _OWN
        third_party = not own and ("site-packages" in record.pathname
                                   or "dist-packages" in record.pathname)
        if third_party and record.levelno < logging.WARNING:
            return False
        return not (third_party and record.levelno == logging.WARNING
                    and isinstance(record.msg, str) and record.msg.startswith(_NO_ACTION))


class PoolRetryLines(logging.Filter):
    """asyncpg's pool logs every failed attempt to restore its connections (Postgres
    restarting, or gone) as a WARNING with a traceback of its own code: one line naming
    the error instead, as often as it retries."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "asyncpg.pool" and record.exc_info and record.exc_info[1]:
            exc = record.exc_info[1]
            record.msg = f"{record.getMessage()}: {type(exc).__name__}: {exc}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, worker,
    and request_id / agent_id when known; `exc` holds a traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "worker": getattr(record, "worker", ""),
        }
        for key in CONTEXT_FIELDS:
            value = getattr(record, key, None)
            if value:
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def quiet_libraries(stream: IO[str] | None = None) -> None:
    """Silence third-party start-up noise (module doc). Progress bars go only when
    `stream` (default stderr) is not a terminal; a variable already set is kept."""
    for name in _NOISY:
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
    stream = sys.stderr if stream is None else stream
    if stream.isatty():
        return
    # Read by tqdm and huggingface_hub when imported: children inherit them too.
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]


def configure_logging(*, level: str, fmt: LogFormat = LogFormat.TEXT, worker: str = "",
                      stream: IO[str] | None = None) -> logging.Handler:
    """The root logger's one handler (replacing one this function installed before),
    at `level`, formatted as `fmt`, its records naming `worker`."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_intentroute", False)]:
        root.removeHandler(old)
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler._intentroute = True  # type: ignore[attr-defined]
    handler.addFilter(ContextFilter(worker or "-"))
    handler.addFilter(LibraryNoiseFilter())
    handler.addFilter(PoolRetryLines())
    handler.setFormatter(JsonFormatter() if fmt is LogFormat.JSON else logging.Formatter(_TEXT))
    # LOG_LEVEL holds for loggers with a level of their own too (bm25s sets DEBUG on
    # import: a "Building index from tokens" line in every `up`).
    handler.setLevel(level.upper())
    root.addHandler(handler)
    root.setLevel(level.upper())
    quiet_libraries(stream)
    return handler
