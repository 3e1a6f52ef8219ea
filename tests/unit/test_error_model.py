"""One error model (shared.contracts.errors): every code has one row of the doors' table,
every door maps a code through that row only, and every error class on the request path
is an IntentrouteError saying its code and whether a retry can help."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Any

import grpc
import pytest

from services.doors.grpc_server import abort
from services.doors.http import refusal
from services.doors.openai_door import wire
from shared.contracts.errors import (
    ADMISSION_REFUSALS,
    DOOR_STATUS,
    IntentrouteError,
    PermanentError,
    RetryableError,
    door_status,
)
from shared.contracts.response import ErrorCode

REPO = Path(__file__).resolve().parents[2]
# Where a request is served: every error class there is in the model, and the errors the
# ports a stage calls through declare (the store's, a model backend's). The offline
# training and evaluation tools under services/*/offline are not on it, nor the
# operator's commands (shared/store/agents.py, policies.py) nor the learning job.
REQUEST_PATH = ("services", "shared/runtime", "shared/client", "shared/store/ports.py",
                "shared/llm/ports.py")
# Offline tools and ingest (run by the CLI and `up`, never on a request) are off the path.
OFF_THE_PATH = ("offline", "indexing")


def test_every_code_has_one_row_with_a_status_for_every_door() -> None:
    assert set(DOOR_STATUS) == set(ErrorCode)
    for code, row in DOOR_STATUS.items():
        assert 400 <= row.http < 600, code
        assert row.openai in {"invalid_request_error", "authentication_error",
                              "permission_error", "rate_limit_error", "server_error"}, code
        assert grpc.StatusCode[row.grpc] is not grpc.StatusCode.OK, code
    # A refusal that says when to ask again is a 429 / RESOURCE_EXHAUSTED everywhere.
    for code in (*ADMISSION_REFUSALS, ErrorCode.QUEUE_FULL, ErrorCode.THROTTLED):
        assert (door_status(code).http, door_status(code).grpc) == (429, "RESOURCE_EXHAUSTED")
    # A code a newer worker sent that this version does not know: an internal error.
    assert door_status("SOMETHING_NEW").http == 500


@pytest.mark.parametrize("code", list(ErrorCode))
def test_the_http_feedback_route_answers_each_code_with_its_row(code: ErrorCode) -> None:
    response = refusal("r-1", code, "why")
    assert response.status == DOOR_STATUS[code].http
    assert response.body is not None
    assert code.value.encode() in bytes(response.body)  # type: ignore[arg-type]


@pytest.mark.parametrize("code", list(ErrorCode))
def test_the_openai_door_answers_each_code_with_its_row(code: ErrorCode) -> None:
    status, envelope = wire.error_envelope(code, "why", None)
    row = DOOR_STATUS[code]
    assert status == row.http
    assert envelope.error.type == row.openai
    # The code itself, unless OpenAI has its own for the failure (a caller's SDK and
    # tools tell it by that one: `model_not_found`).
    assert envelope.error.code == (row.openai_code or code)
    assert envelope.error.param == row.openai_param


class _Context:
    """Enough of a grpc.aio.ServicerContext to see what an abort sends."""

    def __init__(self) -> None:
        self.trailers: tuple[Any, ...] = ()
        self.status: grpc.StatusCode | None = None
        self.details = ""

    def set_trailing_metadata(self, trailers: tuple[Any, ...]) -> None:
        self.trailers = trailers

    async def abort(self, status: grpc.StatusCode, details: str) -> None:
        self.status, self.details = status, details
        raise grpc.aio.AbortError


@pytest.mark.parametrize("code", list(ErrorCode))
async def test_the_grpc_door_aborts_each_code_with_its_row(code: ErrorCode) -> None:
    context = _Context()
    with pytest.raises(grpc.aio.AbortError):
        await abort(context, code, "why", 1500)  # type: ignore[arg-type]
    assert context.status is grpc.StatusCode[DOOR_STATUS[code].grpc]
    assert context.details == f"{code.value}: why"
    assert dict(context.trailers) == {"retry-after": "2", "retry-after-ms": "1500"}


def _error_classes() -> list[tuple[str, str]]:
    """(module, class) of every class named `...Error` defined on the request path."""
    found = []
    for top in REQUEST_PATH:
        root = REPO / top
        for path in sorted(root.rglob("*.py") if root.is_dir() else [root]):
            if any(part in OFF_THE_PATH for part in path.parts) or "migrations" in path.parts:
                continue
            module = ".".join(path.relative_to(REPO).with_suffix("").parts)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                    found.append((module, node.name))
    return found


@pytest.mark.parametrize(("module", "name"), _error_classes(),
                         ids=lambda value: str(value).rsplit(".", 1)[-1])
def test_every_error_class_on_the_request_path_is_in_the_model(module: str, name: str
                                                                 ) -> None:
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, IntentrouteError), f"{module}.{name}"
    assert isinstance(cls.code, ErrorCode)
    assert isinstance(cls.retryable, bool)


def test_the_two_kinds_say_whether_a_retry_can_help() -> None:
    assert RetryableError("x").retryable
    assert not PermanentError("x").retryable
    error = IntentrouteError("late", code="DEADLINE_EXCEEDED", retry_after_ms=10)
    assert (error.code, error.info.code, error.info.retry_after_ms) == (
        ErrorCode.DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED", 10)
    assert error.message == str(error) == "late"
