"""A bad flag is one line and exit 2 (`apps.OneLineUsage`), while `--help` and a bare
group's help read exactly as Typer prints them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from typer.core import TyperGroup
from typer.testing import CliRunner

from intentroute.cli import app
from intentroute.cli.apps import OneLineUsage


@pytest.fixture
def plain_typer() -> Iterator[None]:
    """The root app as plain Typer builds it, for the duration of a test."""
    app.info.cls = TyperGroup
    try:
        yield
    finally:
        app.info.cls = OneLineUsage


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), terminal_width=100, prog_name="intentroute")
    return result.exit_code, result.output


HELP_CASES = [("--help",), ("ask", "--help"), ("agent", "--help"), ("bench",), ()]


def test_help_reads_as_typer_prints_it(request: pytest.FixtureRequest) -> None:
    ours = [_run(*args) for args in HELP_CASES]
    request.getfixturevalue("plain_typer")
    assert [_run(*args) for args in HELP_CASES] == ours
    assert ours[1][0] == 0
    assert "Usage: intentroute ask" in ours[1][1]


def test_a_bad_flag_is_one_line_instead_of_the_usage_box(
    request: pytest.FixtureRequest,
) -> None:
    assert _run("ask", "q", "--nope") == (
        2, "No such option: --nope (intentroute ask --help shows the options)\n")
    assert _run("agent", "show") == (
        2, "Missing argument 'name' (intentroute agent show --help shows the usage)\n")
    request.getfixturevalue("plain_typer")
    code, boxed = _run("ask", "q", "--nope")
    assert code == 2
    assert len(boxed.splitlines()) > 1  # what a person saw before
