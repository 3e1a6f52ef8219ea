"""initdb killed by a signal runs again from an empty data directory; a refusal (an exit
code) does not, and its message is in the error."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from intentroute.stack.postgres import INITDB_ATTEMPTS, PostgresServer
from intentroute.stack.procs import StackError


def server_with(tmp_path: Path, outcomes: list[int]) -> tuple[PostgresServer, list[list[str]]]:
    """A server whose initdb ends with each of `outcomes` in turn (0: it succeeds,
    negative: killed by that signal); records what each run found in the data dir."""
    server = PostgresServer(tmp_path)
    server.pgdata.mkdir(parents=True)
    found: list[list[str]] = []

    def initdb_once() -> None:
        found.append(sorted(p.name for p in server.pgdata.iterdir()))
        (server.pgdata / "half-written").write_text("x")
        code = outcomes.pop(0)
        if code:
            raise subprocess.CalledProcessError(code, "initdb", stderr=b"initdb: bad things")

    server._initdb_once = initdb_once  # type: ignore[method-assign]
    return server, found


def test_a_crashed_initdb_runs_again_from_an_empty_directory(tmp_path: Path) -> None:
    server, found = server_with(tmp_path, [-11, 0])
    server._initdb()
    assert found == [[], []]  # the second run did not see the first one's files


def test_a_refusal_or_repeated_crashes_are_an_error(tmp_path: Path) -> None:
    refused, found = server_with(tmp_path / "a", [1])
    with pytest.raises(StackError, match="bad things"):
        refused._initdb()
    assert len(found) == 1
    crashing, found = server_with(tmp_path / "b", [-11] * INITDB_ATTEMPTS)
    with pytest.raises(StackError, match="-11"):
        crashing._initdb()
    assert len(found) == INITDB_ATTEMPTS
