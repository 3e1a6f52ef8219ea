"""A command's failure as a person reads it: one line on stderr that says what to do, and
an exit code (docs/guides/cli.md, Errors and exit codes). A traceback only with
`intentroute --debug`.

Exit codes: 0 done; 1 refused or failed (a server away or refusing, an unknown id, a
check that failed); 2 usage (a bad flag, a missing or unreadable file, a bad setting
value, malformed input, nothing to talk to).

`describe` maps the exceptions a command lets through: the CLI's own (`CliError`), a
setting's (`SettingError`), files, NATS, Postgres, connections; anything else is said as
unexpected, with the way to its traceback."""

from __future__ import annotations

import socket
from collections.abc import Callable

from shared.common.settings import SettingError

FAILED = 1
USAGE = 2


class CliError(Exception):
    """A failure said as its message, exit 1: refused, unreachable, unknown."""

    code = FAILED


class UsageError(CliError):
    """A person's mistake in what they gave the command, exit 2."""

    code = USAGE


def describe(exc: BaseException) -> tuple[int, str]:
    """(exit code, the one line) for an exception that ended a command."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, CliError):
        return exc.code, str(exc)
    if isinstance(exc, SettingError):
        return USAGE, str(exc)
    for describer in _DESCRIBERS:
        found = describer(exc)
        if found is not None:
            return found
    return FAILED, (f"unexpected error: {type(exc).__name__}: {exc} (`intentroute --debug "
                    "...` shows where)")


def _file(exc: BaseException) -> tuple[int, str] | None:
    if not isinstance(exc, OSError) or exc.filename is None:
        return None
    what = (exc.strerror or str(exc)).lower()
    if isinstance(exc, FileNotFoundError):
        return USAGE, f"{exc.filename}: {what}: check the path"
    if isinstance(exc, PermissionError):
        return USAGE, f"{exc.filename}: {what}: check its permissions"
    return USAGE, f"{exc.filename}: {what}"


def _nats(exc: BaseException) -> tuple[int, str] | None:
    import nats.errors
    import nats.js.errors

    if isinstance(exc, nats.js.errors.NotFoundError):
        return FAILED, (f"NATS: {exc.description or 'not found'}: has `intentroute up` (or "
                        "`intentroute migrate` on an external server) declared the streams?")
    if isinstance(exc, nats.errors.AuthorizationError):
        return FAILED, "NATS refused the credential: check --creds or the NATS_* settings"
    if isinstance(exc, nats.errors.TimeoutError):
        return FAILED, ("NATS: no reply in time: are the workers running? `intentroute "
                        "status` shows each stage")
    if isinstance(exc, nats.errors.Error):
        return FAILED, f"NATS: {exc}"
    return None


def _postgres(exc: BaseException) -> tuple[int, str] | None:
    import asyncpg

    if isinstance(exc, asyncpg.UndefinedTableError):
        return FAILED, f"Postgres: {exc}: the database has no schema yet: `intentroute migrate`"
    if isinstance(exc, asyncpg.PostgresError):
        return FAILED, f"Postgres: {exc}"
    return None


def _connection(exc: BaseException) -> tuple[int, str] | None:
    if isinstance(exc, TimeoutError):
        return FAILED, "no reply in time: is the server running? (`intentroute --timeout`)"
    if isinstance(exc, socket.gaierror):
        return FAILED, f"unknown host: {exc.strerror or exc}: check the server's URL"
    if isinstance(exc, ConnectionError | OSError):
        return FAILED, f"{exc.strerror or exc}: is the server running, and its URL right?"
    return None


def _malformed(exc: BaseException) -> tuple[int, str] | None:
    import msgspec

    if isinstance(exc, msgspec.DecodeError | msgspec.ValidationError):
        return USAGE, f"malformed input: {exc}"
    return None


def _model(exc: BaseException) -> tuple[int, str] | None:
    from shared.encoders.packaged import ModelAssemblyError

    if isinstance(exc, ModelAssemblyError):  # its message names the package to install
        return USAGE, str(exc)
    return None


_DESCRIBERS: tuple[Callable[[BaseException], tuple[int, str] | None], ...] = (
    _model, _file, _nats, _postgres, _connection, _malformed)
